"""A stand-in trainer for the distributed weight push test, run with the SGLang venv's
python (it needs torch and SGLang's process-group helper):

    python gloo_trainer.py MODEL_DIR SPEC_OUT MASTER_PORT WORLD_SIZE GROUP_NAME

It writes the names, dtypes and shapes of the checkpoint's tensors to SPEC_OUT (what the
test sends to PEARL's ``/update_weights``), joins the weight group as rank 0 over gloo
and broadcasts every tensor in that order, as a trainer would after an update.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    model_dir, spec_out, port, world_size, group = sys.argv[1:6]
    from safetensors.torch import load_file

    tensors: dict = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    names = sorted(tensors)
    spec = {"names": names, "dtypes": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(tensors[n].shape) for n in names]}
    Path(spec_out + ".tmp").write_text(json.dumps(spec))
    Path(spec_out + ".tmp").rename(spec_out)

    import torch.distributed as dist
    from sglang.srt.utils.common import init_custom_process_group

    pg = init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                   world_size=int(world_size), rank=0, group_name=group)
    for name in names:
        dist.broadcast(tensors[name].contiguous(), src=0, group=pg)
    print(f"broadcast {len(names)} tensors", flush=True)
    # Torn down here, not by the interpreter's exit: gloo's threads left to the exit
    # sometimes abort the process ("terminate called without an active exception").
    dist.destroy_process_group(pg)


if __name__ == "__main__":
    main()
