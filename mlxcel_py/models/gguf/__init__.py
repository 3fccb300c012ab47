"""GGUF files as mlx-lm folders: conversion into the cache folder (convert), the architecture
and config mapping (arch), and the tokenizer rebuilt from the file's metadata (tokenizer)."""
