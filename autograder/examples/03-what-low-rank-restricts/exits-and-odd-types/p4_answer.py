# Your answer goes in `answer_p4`.
import torch
answer_p4 = torch.tensor((16 / 8) * 32, requires_grad=True)  # a tensor that requires grad: fine
