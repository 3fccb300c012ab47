"""models.gguf"""
