"""Vision-language models: images in the prompt, token ids out.

`images` reads and checks an image from any door (a file, a data: URL, base64); `prompts` turns a
conversation with images into token ids through the model's own processor and chat template;
`target` is the engine's model, on which an image position's negative id names its row; `loading`
says which configs load here and builds them through mlx-vlm (docs/vision.md).
"""
