class LlamaPromptLookupDecoding:
    def __init__(self, max_ngram_size=2, num_pred_tokens=10):
        self.max_ngram_size = max_ngram_size
        self.num_pred_tokens = num_pred_tokens
