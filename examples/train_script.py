"""An ordinary training script (argparse, a model, an optimizer, a loop): profile it unmodified with

    opscope profile examples/train_script.py --skip-steps 2 --steps 3 -- --steps 20 --batch-size 64

opscope counts one step per optimizer step and profiles steps 3-5; `--step-fn train_script:train_step`
counts calls of train_step instead. With torchrun's environment (RANK, WORLD_SIZE: `opscope profile ...
--nproc-per-node 2`) it trains with DistributedDataParallel, as such scripts do.
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.fc2(F.gelu(self.fc1(x)))
        return self.head(x)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(int(os.environ.get("RANK", "0")))
    model = Net(args.width)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.width)
        y = torch.randint(0, 10, (args.batch_size,))
        loss = train_step(model, optimizer, x, y)
        if step % 10 == 0:
            print(f"step {step} loss {loss:.3f}")
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
