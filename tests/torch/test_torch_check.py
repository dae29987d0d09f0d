"""Warm versus cold through real tensors: every layout bitwise equal with real hits,
preemptions, evictions and shuffled placement; a broken table is caught; poisoned blocks
never leak; the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pagedkv.cli import main
from pagedkv.torch import Placement, ShuffledPlacement
from pagedkv.torch.check import (
    LAYOUTS,
    Layout,
    check_layout,
    compare_runs,
    layout_named,
    run_layout,
    workload,
)

NUM_SAMPLED = sum(max_new for _, _, max_new in workload())


@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay.name for lay in LAYOUTS])
def test_cached_and_uncached_logits_are_bitwise_equal(layout: Layout) -> None:
    result = check_layout(layout)
    assert result.hit_tokens > 0  # not vacuous: the cached run really skipped work
    assert result.computed_tokens_cached < result.computed_tokens_uncached
    assert result.preemptions > 0 and result.evicted_blocks > 0
    assert result.compared_positions == NUM_SAMPLED
    assert result.bitwise_equal and result.max_abs_diff == 0.0
    assert result.null_block_untouched and result.ok


def test_another_placement_seed_gives_the_same_logits() -> None:
    layout = layout_named("full+mamba")
    a = run_layout(layout, enable_caching=True,
                   placement=lambda n: ShuffledPlacement(num_blocks=n, seed=11))
    b = run_layout(layout, enable_caching=True)
    assert compare_runs(layout.name, a, b).bitwise_equal
    assert a.outputs == b.outputs


class _SwapFirstBlocksOnce(Placement):
    """Swaps the first block ids of the first two rows of the first table that has two
    different ones: one wrong id in one step."""

    def __init__(self, inner: Placement) -> None:
        self.inner = inner
        self.swapped = False

    def physical(self, block_ids: torch.Tensor) -> torch.Tensor:
        out = self.inner.physical(block_ids)
        if not self.swapped and out.dim() == 2 and out.shape[0] >= 2:
            a, b = int(out[0, 0]), int(out[1, 0])
            if a and b and a != b:
                out = out.clone()
                out[0, 0], out[1, 0] = b, a
                self.swapped = True
        return out


@pytest.mark.parametrize("name", ["full", "full+mamba"])
def test_one_swapped_block_table_id_fails_the_check(name: str) -> None:
    layout = layout_named(name)
    requests = workload()[:4]  # req-0 and req-1 share no token
    swap = _SwapFirstBlocksOnce(ShuffledPlacement(num_blocks=layout.plan().num_blocks, seed=1))
    broken = run_layout(layout, enable_caching=True, placement=lambda n: swap,
                        requests=requests)
    cold = run_layout(layout, enable_caching=False, requests=requests)
    assert swap.swapped
    result = compare_runs(name, broken, cold)
    assert not result.bitwise_equal and not result.ok
    assert result.max_abs_diff > 0


def test_nan_poisoned_reused_blocks_never_leak() -> None:
    """Every fresh block (many are evicted cached blocks being reused) is overwritten with
    NaN before the step writes it; the logits equal those of a run that zero-fills."""
    for name in ("full+sliding", "full+mamba"):
        layout = layout_named(name)
        poisoned = run_layout(layout, enable_caching=True, poison_value=math.nan)
        clean = run_layout(layout, enable_caching=True, poison_value=None)
        assert poisoned.stats.poisoned_blocks > 0 and poisoned.num_evicted_blocks > 0
        assert all(not v.isnan().any() for v in poisoned.logits.values())
        assert compare_runs(name, poisoned, clean).bitwise_equal


def test_cli_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-attention", "--layout", "full", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["layouts"][0]["bitwise_equal"] and doc["layouts"][0]["hit_tokens"]
    assert main(["check-attention", "--layout", "nope"]) == 2
    assert "unknown layout 'nope'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["check-attention", "--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


def test_without_torch_the_command_says_which_extra_to_install() -> None:
    import subprocess
    import sys

    code = ("import os, sys; sys.modules['torch'] = None; os.environ['PAGEDKV_GPU'] = '0'\n"
            "from pagedkv.cli import main\n"
            "sys.exit(main(['check-attention']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "pagedkv check-attention: error: pagedkv.torch needs PyTorch; install it with: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu && "
        "pip install 'pagedkv[torch]'"]


def test_engine_refuses_caller_mistakes() -> None:
    from pagedkv import CacheConfig, InvalidArgumentError, KVCacheManager
    from pagedkv.torch import Engine, KVCacheTensors, TinyDecoder, TinyModelConfig

    layout = layout_named("full")
    plan = layout.plan()
    cache = KVCacheTensors(plan, dtype=torch.float32)
    mgr = KVCacheManager(CacheConfig(groups=tuple(g.spec for g in plan.groups),
                                     num_blocks=plan.num_blocks, max_model_len=160))
    engine = Engine(mgr, TinyDecoder(TinyModelConfig(), cache), cache,
                    max_num_batched_tokens=16, max_num_running=2)
    engine.add_request("a", [1, 2, 3], 2)
    with pytest.raises(InvalidArgumentError, match="already in the engine"):
        engine.add_request("a", [1, 2], 2)
    with pytest.raises(InvalidArgumentError, match="exceed max_model_len"):
        engine.add_request("b", list(range(159)), 2)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens"):
        engine.add_request("c", [1], 0)
    engine.run()
    assert list(engine.finished) == ["a"] and len(engine.finished["a"]) == 2
    assert not mgr.has_request("a")


def test_logits_do_not_depend_on_batching_or_threads() -> None:
    """The same requests with a 7-token step budget (many small chunks, other batch
    mixes) and with two torch threads give the same bits as the default run."""
    layout = layout_named("full+sliding")
    requests = workload()[:5]
    base = run_layout(layout, enable_caching=True, requests=requests)
    small_steps = run_layout(layout, enable_caching=True, requests=requests,
                             max_num_batched_tokens=7)
    assert small_steps.stats.steps > base.stats.steps
    assert compare_runs(layout.name, base, small_steps).bitwise_equal
    torch.set_num_threads(2)  # the autouse fixture restores the count
    two_threads = run_layout(layout, enable_caching=False, requests=requests)
    assert compare_runs(layout.name, base, two_threads).bitwise_equal
