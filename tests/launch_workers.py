"""Worker entry points for tests/test_launch.py (spawned workers import them by module name)."""

import os

import torch
import torch.distributed as dist

from pytorch_zerocopy.launch import init_worker


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def ddp_on_shared_table(table, steps):
    import pytorch_zerocopy  # noqa: F401

    info = init_worker(use_gpu=False)  # as many ranks as asked, whatever the GPU count
    torch.manual_seed(1234)  # same initial weights everywhere; DDP also broadcasts them
    warm = torch.randn(64, table.shape[1]).to("unified")  # GPU context and kernels load here,
    float(warm.double().sum())                          # not inside the measurement below
    before = _rss_anon()
    features = table.to("unified")
    checksum = float(features.double().sum())  # reads every byte through the mapping
    growth = _rss_anon() - before
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(table.shape[1], 3).to(info.device))
    initial = [p.detach().cpu().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + info.rank)  # each rank trains on different rows
    for _ in range(steps):
        idx = torch.randint(0, table.shape[0], (32,), generator=gen)
        loss = model(features[idx].to(info.device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = [p.detach().cpu() for p in model.parameters()]
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": info.rank, "world_size": info.world_size, "checksum": checksum, "anon_growth": growth,
            "initial": initial, "params": params, "pid": os.getpid()}


def fail_on_rank_one(message):
    info = init_worker(use_gpu=False)
    if info.rank == 1:
        raise ValueError(message)
    dist.barrier()  # rank 0 waits here until the job is torn down
    return info.rank
