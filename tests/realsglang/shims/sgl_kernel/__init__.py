"""Test-only stand-in for ``sgl_kernel`` so SGLang's CPU engine imports without CUDA.

PyPI's sgl-kernel wheels hold only CUDA libraries. SGLang's CPU path imports a few
names at module load; without the AMX ops registered it computes with torch itself.
We provide the one helper the CPU scheduler calls, placeholders that raise for names
that are only imported, and AttributeError for anything else so SGLang's own
fallbacks still apply.
"""


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                 out_cache_loc, pool_len):
    offset = 0
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        req_to_token[row, start:end] = out_cache_loc[offset:offset + n]
        offset += n


def _unavailable(name):
    def fn(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel.{name} is not available in the CPU test stand-in")

    fn.__name__ = name
    return fn


for _name in (
    "copy_all_layer_kv_cache_cpu",
    "rotate_input_ids_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
):
    globals()[_name] = _unavailable(_name)


def __getattr__(name):
    raise AttributeError(f"module 'sgl_kernel' (CPU test stand-in) has no attribute {name!r}")
