"""The relay's slots and uploads, the param server's buffers, the overlap of host updates, options and state."""

import dataclasses
import threading
import time

import pytest
import torch

from methods.l2l.relay import Slot
from suite.config.errors import ConfigError
from suite.config.run import ModelConfig, RunConfig, apply_overrides
from suite.core.check import build_method, relative_error
from suite.core.registry import get
from suite.harness.data import synthetic_batches

BLOCKS = 4


def _method(**kw):
    options = kw.pop("options", {})
    run = RunConfig(
        method=kw.pop("method", "l2l"),
        device="cpu",
        model=ModelConfig(layers=BLOCKS),
        seq_len=16,
        micro_batch_size=2,
        num_micro_batches=2,
        options=options,
        **kw,
    ).validate()
    return build_method(run)


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_device_holds_embeddings_head_and_two_blocks():
    m = _method()
    layers = m.model.layers
    assert len(m.relay.slots) == 4
    weights = _numel(layers[0]) + _numel(layers[-1]) + 2 * _numel(layers[1])
    assert m.resident_device_bytes() == 2 * 4 * weights  # FP32 weights + gradient buffers
    for slot in m.relay.slots:  # one upload and one download per layer: views of two flat buffers
        for p in slot.module.parameters():
            assert p.untyped_storage().data_ptr() == slot.flat.untyped_storage().data_ptr()
            assert p.grad.untyped_storage().data_ptr() == slot.grad.untyped_storage().data_ptr()


def test_uploads_reuse_the_blocks_left_by_the_forward():
    m = _method()
    batches = synthetic_batches(m.run)
    for _ in range(2):
        m.step(next(batches))
    # Forward: embeddings, every block, head. Backward: the last two blocks and the embeddings are
    # still in their slots (not yet updated), the other blocks come again.
    assert m.relay.uploads == 2 * ((BLOCKS + 2) + (BLOCKS - 2))


def test_host_buffers_are_allocated_once():
    m = _method(options=dict(overlap="on", stash="cpu"), optimizer="adamw")
    server = m.server

    def pointers():
        bufs = server.flat + server.wire + server.gradient_buffers() + server.optimizer_state()
        return [t.data_ptr() for t in bufs] + [t.data_ptr() for s in m.relay.slots for t in (s.flat, s.grad)]

    before = pointers()
    batches = synthetic_batches(m.run)
    m.step(next(batches))
    stash = {k: v.data_ptr() for k, v in m.stash.host.items()}
    m.step(next(batches))
    m.state_dict()
    assert pointers() == before
    assert {k: v.data_ptr() for k, v in m.stash.host.items()} == stash
    # The model's own parameters are views of the flat host masters.
    for i, named in enumerate(server.named):
        lo, hi = server.flat[i].data_ptr(), server.flat[i].data_ptr() + server.flat[i].nbytes
        assert all(lo <= p.data_ptr() < hi for _, p in named)


def test_state_dict_is_fp32_cpu_copies_by_hf_name():
    m = _method()
    m.step(next(synthetic_batches(m.run)))
    state = m.state_dict()
    assert list(state) == [n for i in range(m.model.num_layers) for n, _ in m.model.layer_named_parameters(i)]
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in state.values())
    # Host side, FP32 LAMB: master, gradient and two moments, 16 bytes per parameter.
    assert m.server.nbytes() == 16 * sum(v.numel() for v in state.values())
    name = next(iter(state))
    state[name].add_(1.0)
    assert not torch.equal(state[name], m.state_dict()[name])


def _host_commit_during_backward(m, timeout: float) -> bool:
    """Run a step, holding the embeddings' backward until the host has committed any layer
    (or `timeout` passes); True if a commit happened while the device side was still in the backward."""
    committed = threading.Event()
    seen = []
    commit, use = m.server.commit, m.relay.use

    def logged_commit(*args, **kw):
        commit(*args, **kw)
        committed.set()

    def gated_use(layer):
        seen.append(layer)
        if layer == 0 and len(seen) > 1:  # the embeddings again: their backward
            seen.append(committed.wait(timeout))
        return use(layer)

    m.server.commit, m.relay.use = logged_commit, gated_use
    m.step(next(synthetic_batches(m.run)))
    m.state_dict()
    return seen[-1] is True


def test_overlap_updates_layers_while_the_backward_runs():
    assert _host_commit_during_backward(_method(options=dict(overlap="on")), timeout=30.0)


@pytest.mark.parametrize(
    "kw",
    [dict(options=dict(overlap="off")), dict(options=dict(overlap="on"), clip_grad_norm=1.0)],
    ids=["overlap-off", "overlap-on-clipping"],
)
def test_no_update_before_the_backward_has_finished(kw):
    # Algorithm 2 updates after the backward; a global gate (clipping) defers the commits too.
    assert not _host_commit_during_backward(_method(**kw), timeout=0.5)


def test_options_are_declared_and_validated():
    cls = get("l2l")
    assert cls.options["stash"].default == "gpu" and cls.options["overlap"].default == "off"
    run = apply_overrides(RunConfig(method="l2l"), ["stash=cpu", "overlap=on"], cls.options)
    assert run.options == {"stash": "cpu", "overlap": "on"}
    with pytest.raises(ConfigError):
        apply_overrides(RunConfig(method="l2l"), ["stash=disk"], cls.options)
    assert get("l2l-cmp").precisions == ("fp16", "bf16") and get("l2l").precisions == ("fp32",)


def test_batches_of_changing_length_match_grad_accum():
    # Fine-tuning trims each batch to its longest sample: the offloaded stash must follow the shape.
    m = _method(options=dict(stash="cpu", overlap="on"))
    ref = build_method(dataclasses.replace(m.run, method="grad_accum", options={}))
    w0 = ref.state_dict()
    for batch, length in zip(synthetic_batches(m.run, padded=True), (16, 8, 12)):
        cut = lambda t: t[:, :length].contiguous()  # noqa: E731
        batch = dataclasses.replace(
            batch,
            input_ids=cut(batch.input_ids),
            attention_mask=cut(batch.attention_mask),
            token_type_ids=cut(batch.token_type_ids),
        )
        m.step(batch)
        ref.step(batch)
    ours, theirs = m.state_dict(), ref.state_dict()
    assert (
        max(relative_error(ours[k] - w0[k], theirs[k] - w0[k]) for k in ours if k not in ref.model.gradient_free())
        <= 1e-6
    )
    assert all(buf.numel() == 2 * 16 * m.model.cfg.hidden for buf in m.stash.host.values())


def _times_of_a_slow_host(m, delay: float = 0.05):
    """Two steps with every commit slowed by `delay` s: (when each commit of step 0 ended, when step 1's forward
    began on the device side), on one clock."""
    commit, forward = m.server.commit, m.model.forward_layer
    ends, starts = [], []

    def slow_commit(layer, step, *args):
        time.sleep(delay)
        commit(layer, step, *args)
        if step == 0:
            ends.append(time.perf_counter())

    def timed_forward(layer, *args, **kw):
        if m.step_count == 1 and layer == 0 and not starts:
            starts.append(time.perf_counter())
        return forward(layer, *args, **kw)

    m.server.commit, m.model.forward_layer = slow_commit, timed_forward
    batches = synthetic_batches(m.run)
    for _ in range(2):
        m.step(next(batches))
    m.state_dict()
    return ends, starts[0]


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(clip_grad_norm=1.0),
        dict(method="l2l-cmp", precision="fp16"),
        dict(method="l2l-cmp", precision="bf16"),
    ],
    ids=["ungated", "gated-clipping", "gated-fp16", "ungated-bf16"],
)
def test_next_forward_starts_before_the_last_commit_of_a_slow_host(kw):
    # The host takes 50 ms per layer, far slower than this device's layers: the next forward waits only for the
    # embeddings' commit, which the host takes first, not for the top layers' (ungated: those of the backward
    # still queued when it ended; gated: all of them, queued once the verdict is known).
    # Held landings (ungated, the ring would hold the device back instead: the next test).
    ends, start = _times_of_a_slow_host(_method(options=dict(overlap="on", landing="held"), **kw))
    assert len(ends) == BLOCKS + 2
    assert start < max(ends), (start, ends)


def test_the_ring_holds_the_device_within_three_layers_of_a_slow_host():
    """Applied as they land (the default where nothing gates the step), gradients pass through three buffers: the
    device ships layer l's gradient only once layer l + 3's update has finished, whatever the host's pace."""
    m = _method(options=dict(overlap="on"))
    assert m.server.ring == 3
    done, shipped, commit, landing = {}, {}, m.server.commit, m.updater.landing

    def slow_commit(layer, step, *args):
        time.sleep(0.05)
        commit(layer, step, *args)
        done[layer] = time.perf_counter()

    def timed_landing(layer):
        buf = landing(layer)
        shipped[layer] = time.perf_counter()
        return buf

    m.server.commit, m.updater.landing = slow_commit, timed_landing
    m.step(next(synthetic_batches(m.run)))
    m.state_dict()
    assert all(done[layer + 3] <= shipped[layer] for layer in range(BLOCKS + 2 - 3)), (done, shipped)
    assert shipped[0] > done[BLOCKS + 1]  # the head's update (the first, 50 ms) held the embeddings' gradient back


def test_a_slow_host_commits_the_embeddings_before_the_top_layers_left_queued():
    m = _method(options=dict(overlap="on", landing="held"))
    order, commit = [], m.server.commit

    def slow_commit(layer, step, *args):
        # The first (the head's) long enough for the tiny backward to land every other gradient meanwhile, even on
        # a loaded machine (at 50 ms a busy 2-core machine once had layer 3 land before 0).
        time.sleep(0.5 if not order else 0.05)
        commit(layer, step, *args)
        order.append(layer)

    m.server.commit = slow_commit
    m.step(next(synthetic_batches(m.run)))
    m.state_dict()
    # The head's update starts as its gradient lands; by its end every other gradient has landed, and the host
    # takes them lowest first: the order the next forward needs them in.
    assert order == [BLOCKS + 1, *range(BLOCKS + 1)]


@pytest.mark.parametrize("kw", [dict(), dict(method="l2l-cmp", precision="bf16", options=dict(overlap="on"))])
def test_a_device_layer_cache_keeps_every_block_and_uploads_each_layer_once_a_step(kw):
    """block_slots as many as the blocks (issue 54, item 4): the backward finds every block where the forward left
    it, so each layer crosses the bus once a step (after its update), against blocks - 2 more with two slots; the
    same bits as two slots, and the device holds one more slot a block."""
    options = kw.pop("options", {})
    two, cached = (_method(options={**options, "block_slots": k}, **kw) for k in (2, BLOCKS))
    assert len(cached.relay.blocks) == BLOCKS and len(two.relay.blocks) == 2
    one_block = cached.relay.blocks[0].nbytes()
    assert cached.resident_device_bytes() == two.resident_device_bytes() + (BLOCKS - 2) * one_block
    batches = synthetic_batches(two.run)
    for _ in range(3):
        batch = next(batches)
        for m in (two, cached):
            before = m.relay.uploads
            m.step(batch)
            m.state_dict()
            m.uploads_last = m.relay.uploads - before
        assert cached.uploads_last == BLOCKS + 2 and two.uploads_last == (BLOCKS + 2) + (BLOCKS - 2)
    ours, theirs = cached.state_dict(), two.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_block_slots_below_two_are_refused():
    with pytest.raises(ConfigError, match="block_slots=1"):
        _method(options={"block_slots": 1})


def test_a_16_bit_slot_sums_its_micro_batches_in_fp32():
    """A bf16 slot sums its micro-batches' gradients in FP32 and rounds the sum once (issue 63, item 5): 1 and
    sixteen 2^-9 make 1.03125, where sixteen additions in bf16 (an ulp of 2^-7 at 1) would leave 1.0."""
    slot = Slot(torch.nn.Linear(1, 1, bias=False), torch.device("cpu"), torch.bfloat16)
    sums = torch.empty(1)
    (w,) = slot.params
    bf16 = torch.zeros((), dtype=torch.bfloat16)
    for u, g in enumerate([1.0] + [2.0**-9] * 16):
        (w.sum() * g).backward()
        bf16 += w.grad.sum()
        slot.accumulate(sums, u == 0)
        assert w.grad is None  # the next micro-batch's gradient arrives in a fresh tensor
    slot.round_sums(sums)
    assert slot.grad.item() == 1.03125 and bf16.item() == 1.0
