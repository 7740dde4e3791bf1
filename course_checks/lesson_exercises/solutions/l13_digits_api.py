"""Reference solution of exercise 13.litapi: a batching LitAPI serving the shipped digits CNN.

A file the course's process helper can serve by path (it imports only installed packages).
"""

from typing import Annotated

import litserve as ls
import torch
from pydantic import BaseModel, Field

Pixel = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]  # the scale the CNN was trained on
Row = Annotated[list[Pixel], Field(min_length=8, max_length=8)]


class DigitsRequest(BaseModel):
    pixels: Annotated[list[Row], Field(min_length=8, max_length=8)]


class SolutionDigitsAPI(ls.LitAPI):
    def setup(self, device):
        from course_utils.supply.models import load_digits_model

        torch.set_num_threads(1)
        self.model = load_digits_model("cnn", device=device)
        self.device = device

    def decode_request(self, request: DigitsRequest):
        return torch.tensor(request.pixels, dtype=torch.float32).unsqueeze(0)  # (1, 8, 8)

    def batch(self, images):
        return torch.stack(images)  # (N, 1, 8, 8)

    def predict(self, x):
        with torch.inference_mode():
            logits = self.model(x.to(self.device))
        return torch.softmax(logits, dim=-1).cpu()

    def unbatch(self, probs):
        return list(probs)

    def encode_response(self, probs):
        return {"label": int(probs.argmax()), "probs": probs.tolist()}
