# Apache License 2.0 (see LICENSE)
"""Hold a known amount of GPU memory with torch until killed (for tests/gpu/device_check.sh).

    python3 hold_gpu_memory.py --gib 20 --gpus 0[,1...] [--delay SECONDS] [--info FILE]

CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES=<gpus> are set before torch is imported, so
the k-th GPU torch sees is the k-th index given, numbered as nvidia-smi numbers them. After
``--delay`` seconds it allocates ``--gib`` GiB (one uint8 tensor) on every listed GPU, writes
a JSON record (pid, per GPU: torch.cuda.mem_get_info before and after, in MiB) to ``--info``,
prints ``ready`` and sleeps until SIGTERM/SIGINT.
"""
import argparse
import json
import os
import signal
import sys
import time

MIB = 1024 * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--gib", type=float, required=True)
    parser.add_argument("--gpus", default="0", help="nvidia-smi indices, comma-separated")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--info")
    args = parser.parse_args()

    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(args.delay)

    import torch  # pylint: disable=import-outside-toplevel,import-error

    record = {"pid": os.getpid(), "gib": args.gib, "gpus": {}, "torch": torch.__version__}
    held = []
    for k, index in enumerate(args.gpus.split(",")):
        device = torch.device("cuda", k)
        free0, total = torch.cuda.mem_get_info(device)
        tensor = torch.empty(int(args.gib * 1024 * MIB), dtype=torch.uint8, device=device)
        tensor.fill_(1)
        torch.cuda.synchronize(device)
        free1, _total = torch.cuda.mem_get_info(device)
        held.append(tensor)
        record["gpus"][index] = {
            "name": torch.cuda.get_device_name(device),
            "cuda_total_mib": total // MIB,
            "free_before_mib": free0 // MIB,
            "free_after_mib": free1 // MIB,
            "allocated_mib": torch.cuda.memory_allocated(device) // MIB,
        }
    if args.info:
        with open(args.info, "w") as handle:
            json.dump(record, handle, indent=1)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
