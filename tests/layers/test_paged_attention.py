"""Paged attention: the CPU backend (decode reads blocks in place) and the Triton kernel (interpreted on CPU)
against dense attention, for decode-only, mixed and windowed batches, at and around block boundaries."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.layers.attention.paged_cpu import CacheViews, block_runs, decode_in_place
from omnistage.layers.attention.torch_sdpa import TorchSDPABackend, store_kv
from tests.layers.paged_cases import dense_attention, make_case

SCALE = 16**-0.5
# Different reduction orders (per-run scores, online softmax) than the float64 reference: fp32 rounding only.
TOL = dict(atol=2e-5, rtol=1e-4)

# (context after the step, new tokens) per sequence.
DECODE = [(1, 1), (4, 1), (5, 1), (16, 1), (17, 1), (33, 1)]  # page 4: first slot, last slot, one past a block
MIXED = [(7, 7), (9, 1), (12, 5), (1, 1), (20, 8)]  # fresh prompt, decode, prefill after a cached prefix
BATCHES = {"decode": DECODE, "mixed": MIXED}


@pytest.mark.parametrize("native", [True, False], ids=["c-kernel", "torch-ops"])
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("window", [None, 5])
def test_torch_backend_matches_dense(batch: str, window: int | None, native: bool) -> None:
    """Decode rows through the C kernel (where it builds) and through torch ops."""
    case = make_case(BATCHES[batch], page=4)
    out = TorchSDPABackend(native).forward(case.q, case.k, case.v, case.kv_cache, case.meta, SCALE, window)
    torch.testing.assert_close(out, dense_attention(case, SCALE, window), **TOL)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "page"), [(16, 2, 128, 16), (6, 6, 64, 16), (8, 1, 20, 4)])
def test_c_kernel_matches_torch_ops_at_real_shapes(heads: int, kv_heads: int, head_dim: int, page: int) -> None:
    """Real head sizes and groups (Qwen3's 128-wide heads, 8 queries per KV head), multi-block contexts, a block
    table sliced out of a wider one (its rows' stride is not its width), and a bf16 cache (read back widened)."""
    from omnistage.layers.attention import native

    if native.load() is None:
        pytest.skip("no C compiler: the torch path serves (tested above)")
    case = make_case([(70, 1), (3, 1), (33, 1), (20, 4)], page=page, heads=heads, kv_heads=kv_heads,
                     head_dim=head_dim, num_blocks=80)
    wide = torch.zeros(4, case.meta.block_tables.shape[1] + 3, dtype=torch.int32)
    wide[:, :case.meta.block_tables.shape[1]] = case.meta.block_tables
    case.meta.block_tables = wide[:, :case.meta.block_tables.shape[1]]
    for dtype in (torch.float32, torch.bfloat16):
        cache = case.kv_cache.to(dtype)
        want = TorchSDPABackend(native=False).forward(case.q, case.k, case.v, cache.clone(), case.meta, SCALE)
        got = TorchSDPABackend(native=True).forward(case.q, case.k, case.v, cache, case.meta, SCALE)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (6, 2), (2, 2)], ids=["group2", "group3", "group1"])
@pytest.mark.parametrize("window", [None, 37])
def test_c_kernel_16_wide_heads_over_whole_tiles(heads: int, kv_heads: int, window: int | None) -> None:
    """16-wide heads with 16-slot pages (the tiny thinker's shapes): the kernel's path that unpacks 16 key rows
    once for the whole group, its values in two queries at a time (an odd group leaves one alone) and its inline
    exp, over contexts of whole tiles, tiles plus a remainder, and a window starting mid-block; float32 against
    float64 dense attention (fp32 rounding and the exp polynomial's ~1 ulp: TOL), bf16 against torch ops."""
    from omnistage.layers.attention import native

    if native.load() is None:
        pytest.skip("no C compiler: the torch path serves (tested above)")
    case = make_case([(300, 1), (45, 1), (256, 1), (17, 1), (129, 1)], page=16, heads=heads, kv_heads=kv_heads,
                     head_dim=16, num_blocks=64)
    got = TorchSDPABackend(native=True).forward(case.q, case.k, case.v, case.kv_cache.clone(), case.meta, SCALE,
                                                window)
    torch.testing.assert_close(got, dense_attention(case, SCALE, window).float(), **TOL)
    cache = case.kv_cache.to(torch.bfloat16)
    want = TorchSDPABackend(native=False).forward(case.q, case.k, case.v, cache.clone(), case.meta, SCALE, window)
    got = TorchSDPABackend(native=True).forward(case.q, case.k, case.v, cache, case.meta, SCALE, window)
    torch.testing.assert_close(got, want, **TOL)


FP8 = [torch.float8_e5m2, torch.float8_e4m3fn]


def test_c_kernel_widens_every_fp8_byte_as_torch_does() -> None:
    """All 256 bytes of each fp8 format (subnormals, both zeros, the largest; not inf/NaN, which a cache never
    holds) exactly as torch widens them: one sequence per byte with a context of one position, so its output is
    that position's value row, the byte in every one of its 16 dims."""
    from omnistage.layers.attention import native

    if native.load() is None:
        pytest.skip("no C compiler: the torch path serves (tested above)")
    for dtype in FP8:
        byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        byte = byte[torch.isfinite(byte.view(dtype).float())]
        n = byte.numel()
        cache = torch.zeros(2, n, 1, 1, 16, dtype=torch.uint8)
        cache[1] = byte[:, None, None, None]
        q, seqs = torch.randn(n, 1, 1, 16), torch.arange(n, dtype=torch.int32)
        out = torch.empty_like(q)
        native.paged_decode(native.load(), q, cache.view(dtype), seqs[:, None], torch.ones(n, dtype=torch.int32),
                            seqs, seqs, None, 1, out, threads=1)
        assert torch.equal(out[:, 0, 0], byte.view(dtype).float()[:, None].expand(n, 16))


@pytest.mark.parametrize("dtype", FP8, ids=["e5m2", "e4m3"])
def test_c_kernel_over_an_fp8_cache(dtype: torch.dtype) -> None:
    """An fp8 cache through the kernel (16-wide heads on 16-slot pages, a window, and 20-wide heads on 4-slot
    pages, the generic loop) equals torch ops over the same bytes (TOL: fp32 rounding), and stays near float32
    attention over the unrounded keys and values: on unit-normal keys and values, within atol 0.1 for e4m3 (3
    mantissa bits; 0.054-0.056 seen) and 0.25 for e5m2 (2 bits; 0.11-0.14 seen), against 0.0023 for bf16."""
    from omnistage.layers.attention import native

    if native.load() is None:
        pytest.skip("no C compiler: the torch path serves (tested above)")
    for page, head_dim, window in [(16, 16, None), (16, 16, 37), (4, 20, None)]:
        case = make_case([(300, 1), (45, 1), (17, 1), (129, 1)], page=page, heads=4, kv_heads=2,
                         head_dim=head_dim, num_blocks=160)
        scale = head_dim**-0.5
        cache = case.kv_cache.to(dtype)
        want = TorchSDPABackend(native=False).forward(case.q, case.k, case.v, cache.clone(), case.meta, scale, window)
        got = TorchSDPABackend(native=True).forward(case.q, case.k, case.v, cache, case.meta, scale, window)
        torch.testing.assert_close(got, want, **TOL)
        exact = dense_attention(case, scale, window).float()
        bound = 0.1 if dtype == torch.float8_e4m3fn else 0.25
        torch.testing.assert_close(got, exact, atol=bound, rtol=0)
    # A mixed batch: fresh prompts, decodes, and prefills after a cached prefix (gathered from the fp8 cache).
    case = make_case(MIXED, page=4)
    got = TorchSDPABackend(native=True).forward(case.q, case.k, case.v, case.kv_cache.to(dtype), case.meta, SCALE)
    torch.testing.assert_close(got, dense_attention(case, SCALE).float(), atol=bound, rtol=0)


def test_gathered_decode_agrees_with_in_place() -> None:
    """The padded-gather decode (kept for CUDA graphs without Triton) and the in-place path."""
    case = make_case(DECODE, page=4, seed=1)
    backend = TorchSDPABackend()
    in_place = backend.forward(case.q, case.k, case.v, case.kv_cache, case.meta, SCALE)
    gathered = backend._decode(case.q, case.kv_cache, case.meta, SCALE)
    torch.testing.assert_close(in_place, gathered, **TOL)


def test_block_runs_split_at_jumps() -> None:
    assert block_runs([5, 6, 7, 2, 3, 9], 0, 5) == [(5, 3, 0), (2, 2, 3), (9, 1, 5)]
    assert block_runs([5, 6, 7, 2, 3, 9], 1, 3) == [(6, 2, 1), (2, 1, 3)]
    assert block_runs([8], 0, 0) == [(8, 1, 0)]


class _Allocations(TorchDispatchMode):
    """Largest number of elements any op in the region produced."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in [*args, *(kwargs or {}).values()]
                  if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:  # not a view
                self.largest = max(self.largest, t.numel())
        return out


def test_decode_reads_the_cache_in_place() -> None:
    """No op makes a tensor as large as the context's keys: only views of blocks, scores and the output."""
    case = make_case([(64, 1)], page=16, heads=8, kv_heads=2, head_dim=32)
    table = case.meta.block_table_rows()[0]
    TorchSDPABackend().forward(case.q, case.k, case.v, case.kv_cache, case.meta, SCALE)  # stores the new key
    out = torch.empty(1, 8, 32)
    scaled = (case.q[0] * SCALE).view(2, 4, 32)
    cache = CacheViews.of(case.kv_cache)
    with _Allocations() as alloc:
        decode_in_place(scaled, cache, table, 64, None, out[0].view(2, 4, 32))
    context_keys = 64 * 2 * 32
    assert alloc.largest < context_keys // 4  # scores are 8 x 64; the output 8 x 32
    torch.testing.assert_close(out, dense_attention(case, SCALE), **TOL)


def test_fresh_prompts_without_cache() -> None:
    case = make_case([(6, 6), (3, 3)], page=4)
    out = TorchSDPABackend().forward(case.q, case.k, case.v, None, case.meta, SCALE, 4)
    torch.testing.assert_close(out, dense_attention(case, SCALE, 4), **TOL)


# Triton, interpreted ----------------------------------------------------------------------------

TRITON_BATCHES = {
    "decode": [(1, 1), (16, 1), (17, 1), (40, 1)],  # page 16: first slot, last slot of a block, one past
    "mixed": [(20, 20), (33, 1), (40, 9), (2, 1)],
}


@pytest.mark.parametrize("batch", sorted(TRITON_BATCHES))
@pytest.mark.parametrize(("heads", "kv_heads", "window"), [(4, 2, None), (6, 2, None), (8, 1, 18)])
def test_triton_kernel_matches_torch_backend(interpreted_triton: None, batch: str, heads: int, kv_heads: int,
                                             window: int | None) -> None:
    from omnistage.layers.attention.triton_paged import TritonPagedBackend

    case = make_case(TRITON_BATCHES[batch], page=16, heads=heads, kv_heads=kv_heads, head_dim=24, seed=2)
    scale = 24**-0.5
    cache = case.kv_cache.clone()
    want = TorchSDPABackend().forward(case.q, case.k, case.v, case.kv_cache, case.meta, scale, window)
    got = TritonPagedBackend().forward(case.q, case.k, case.v, cache, case.meta, scale, window)
    torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(got, dense_attention(case, scale, window), **TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", sorted(TRITON_BATCHES))
def test_triton_kernel_on_cuda_bf16(batch: str) -> None:
    from omnistage.layers.attention.triton_paged import TritonPagedBackend

    case = make_case(TRITON_BATCHES[batch], page=16, heads=32, kv_heads=4, head_dim=128, seed=3)
    scale = 128**-0.5
    want = dense_attention(case, scale)
    cuda = {name: getattr(case, name).cuda().bfloat16() for name in ("q", "k", "v", "kv_cache")}
    meta = case.meta
    meta_cuda = type(meta)(meta.query_start_loc.cuda(), meta.context_lens.cuda(), meta.slot_mapping.cuda(),
                           meta.block_tables.cuda(), meta.query_lens, meta.context_lens_cpu)
    got = TritonPagedBackend().forward(cuda["q"], cuda["k"], cuda["v"], cuda["kv_cache"], meta_cuda, scale)
    torch.testing.assert_close(got.float().cpu(), want, atol=3e-2, rtol=3e-2)  # bf16 inputs


def test_loading_the_c_kernel_leaves_denormals_alone() -> None:
    """A library linked with -ffast-math would set flush-to-zero for the whole process when loaded: a subnormal
    temperature then reads as 0 and the sampler's overflow check (tests/runner/test_poison_rows.py) misses it."""
    from omnistage.layers.attention import native

    native.load()
    assert float(torch.tensor([1e-45]) * 1.0) > 0.0


def test_c_kernel_splits_long_steps_over_threads_with_the_same_result() -> None:
    """A step over the kernel's work threshold (sequences x heads x context) runs its items on torch's OpenMP
    threads: each item is computed in the same order on whichever thread, so the outputs are identical to one
    thread's, and match torch ops; the kernel shares torch's runtime (one libgomp mapped)."""
    from omnistage.layers.attention import native

    lib = native.load()
    if lib is None:
        pytest.skip("no C compiler: the torch path serves (tested above)")
    assert len(native.openmp_runtimes()) == 1 and native.kernel_threads() == torch.get_num_threads()
    case = make_case([(300, 1), (45, 1), (257, 1), (129, 1), (200, 1)], page=16, heads=8, kv_heads=2,
                     head_dim=64, num_blocks=80)
    meta, scale = case.meta, 64**-0.5
    store_kv(case.kv_cache, case.k, case.v, meta.slot_mapping)
    seqs, rows = meta.decode_index()
    q = (case.q * scale).view(len(rows), 2, 4, 64)
    outs = {}
    for threads in (1, 2, 3):
        outs[threads] = torch.full_like(q, float("nan"))
        native.paged_decode(lib, q, case.kv_cache, meta.block_tables, meta.context_lens, seqs, rows, None,
                            max(meta.context_lens_cpu), outs[threads], threads=threads)
    assert torch.equal(outs[1], outs[2]) and torch.equal(outs[1], outs[3])
    torch.testing.assert_close(outs[2].view_as(case.q), dense_attention(case, scale).float(), **TOL)
