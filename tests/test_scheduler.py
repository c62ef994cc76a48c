"""Scheduler: batching bounds, FIFO prefill then decode, preemption by recompute, abort, rejection, finishing.

A fake model stands in for the runner: the next token is a fixed function of a sequence's tokens, so a run's
outputs do not depend on how its steps were batched.
"""
import pytest

from minikv.cache.blocks import BlockManager
from minikv.engine.scheduler import Scheduler
from minikv.engine.sequence import SamplingParams, Sequence, SequenceStatus

EOS = 2


def fake_next_token(seq):
    return 10 + (sum(seq.token_ids) * 31 + len(seq)) % 50     # never EOS


def make_seq(request_id, prompt_len=5, max_tokens=4, encoder_len=None, **sampling):
    prompt = [100 + 1000 * request_id + i for i in range(prompt_len)]   # distinct per request: no prefix hits
    encoder = None if encoder_len is None else list(range(encoder_len))
    params = SamplingParams(**{"temperature": 0, "max_tokens": max_tokens, **sampling})
    return Sequence(request_id, f"prompt {request_id}", prompt, params, encoder_token_ids=encoder)


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=256, cross_blocks=None,
                   prefix_caching=False):
    cross = None if cross_blocks is None else BlockManager(cross_blocks, block_size)
    pool = BlockManager(num_blocks, block_size, prefix_caching)
    return Scheduler(max_num_seqs, max_num_batched_tokens, pool, cross_block_manager=cross, eos_token_id=EOS)


def run(scheduler, next_token=fake_next_token, max_steps=1000):
    """Drive the scheduler to the end; return the steps as (is_prefill, [request ids])."""
    steps = []
    bs = scheduler.block_manager.block_size
    while scheduler.has_unfinished():
        seqs, is_prefill = scheduler.schedule()
        assert seqs, "a scheduler with unfinished work must schedule something"
        assert len(scheduler.running) <= scheduler.max_num_seqs
        for seq in seqs:
            assert seq.status is SequenceStatus.RUNNING
            assert len(seq.block_table) == -(-len(seq) // bs)      # the table covers every token to compute
            assert len(seq) - seq.num_cached_tokens >= 1
        steps.append((is_prefill, [seq.request_id for seq in seqs]))
        scheduler.postprocess(seqs, [next_token(seq) for seq in seqs])
        assert len(steps) < max_steps
    assert not scheduler.has_unfinished()
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks
    return steps


def test_first_step_prefills_max_num_seqs_together_and_the_bound_holds():
    scheduler = make_scheduler(max_num_seqs=4)
    seqs = [make_seq(i) for i in range(6)]
    for seq in seqs:
        scheduler.add(seq)
    steps = run(scheduler)
    assert steps[0] == (True, [0, 1, 2, 3])
    assert all(len(ids) <= 4 for _, ids in steps)
    assert all(seq.finish_reason == "length" and seq.num_output_tokens == 4 for seq in seqs)


def test_fifo_prefill_then_decode():
    scheduler = make_scheduler(max_num_seqs=2)
    seqs = [make_seq(0, max_tokens=2), make_seq(1, max_tokens=3), make_seq(2, max_tokens=2)]
    for seq in seqs:
        scheduler.add(seq)
    steps = run(scheduler)
    assert steps == [
        (True, [0, 1]),     # both prefilled together; each gets its first token
        (False, [0, 1]),    # 0 reaches max_tokens=2
        (True, [2]),        # a slot is free: the next waiting request is prefilled before decoding resumes
        (False, [1, 2]),    # running order is admission order; 1 and 2 finish
    ]
    assert [seq.num_output_tokens for seq in seqs] == [2, 3, 2]


def test_token_budget_limits_a_prefill_batch():
    scheduler = make_scheduler(max_num_seqs=4, max_num_batched_tokens=24)
    for i in range(4):
        scheduler.add(make_seq(i, prompt_len=10, max_tokens=4))
    seqs, is_prefill = scheduler.schedule()
    assert is_prefill and [seq.request_id for seq in seqs] == [0, 1]


def test_preemption_by_recompute_keeps_tokens_and_outputs():
    reference = make_scheduler(num_blocks=64)
    expected = [make_seq(i, prompt_len=4, max_tokens=8) for i in range(2)]
    for seq in expected:
        reference.add(seq)
    run(reference)
    assert reference.num_preemptions == 0

    # 4 blocks of 4 tokens: each request needs 3 blocks at most, both together need 6.
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    a, b = make_seq(0, prompt_len=4, max_tokens=8), make_seq(1, prompt_len=4, max_tokens=8)
    scheduler.add(a)
    scheduler.add(b)
    seen_preempted = None
    while scheduler.has_unfinished():
        seqs, is_prefill = scheduler.schedule()
        if scheduler.num_preemptions and seen_preempted is None:
            # b was admitted last, so b is preempted; it waits with every token it generated so far
            assert [seq.request_id for seq in seqs] == [0] and not is_prefill
            assert list(scheduler.waiting) == [b] and b.status is SequenceStatus.WAITING
            assert b.block_table == [] and b.num_cached_tokens == 0
            seen_preempted = list(b.token_ids)
            assert len(seen_preempted) == 9     # 4 prompt + 5 generated; the 5th needs a third block
        if seen_preempted is not None and b in seqs and is_prefill:
            assert b.token_ids == seen_preempted   # re-prefilled with all of its tokens
            assert len(b.block_table) == 3
        scheduler.postprocess(seqs, [fake_next_token(seq) for seq in seqs])
    assert scheduler.num_preemptions == 1
    assert seen_preempted is not None
    assert [a.token_ids, b.token_ids] == [seq.token_ids for seq in expected]
    assert a.finish_reason == b.finish_reason == "length"
    assert scheduler.block_manager.num_free_blocks == 4


def test_a_preempted_sequence_goes_to_the_front_of_the_waiting_queue():
    scheduler = make_scheduler(num_blocks=5, block_size=4, max_num_seqs=2)
    seqs = [make_seq(i, prompt_len=4, max_tokens=8) for i in range(3)]
    for seq in seqs:
        scheduler.add(seq)
    while scheduler.num_preemptions == 0:
        batch, _ = scheduler.schedule()
        scheduler.postprocess(batch, [fake_next_token(seq) for seq in batch])
    assert [seq.request_id for seq in scheduler.waiting] == [1, 2]
    run(scheduler)
    assert all(seq.num_output_tokens == 8 for seq in seqs)


def test_preemption_takes_the_most_recently_admitted_sequence_first():
    # 4 blocks of 4 tokens, all taken by the prefill: request 0 (8 tokens) holds two, 1 and 2 one each.
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_seqs=3)
    seqs = [make_seq(0, prompt_len=8), make_seq(1, prompt_len=4), make_seq(2, prompt_len=4)]
    for seq in seqs:
        scheduler.add(seq)
    batch, is_prefill = scheduler.schedule()
    assert is_prefill and [seq.block_table for seq in batch] == [[0, 1], [2], [3]]
    scheduler.postprocess(batch, [fake_next_token(seq) for seq in batch])
    # Every sequence now needs a new block. Request 0 evicts the newest (2) and takes its block; request 1
    # then finds nothing free and no newer sequence, so it preempts itself.
    batch, is_prefill = scheduler.schedule()
    assert not is_prefill and batch == [seqs[0]] and seqs[0].block_table == [0, 1, 3]
    assert [seq.request_id for seq in scheduler.waiting] == [1, 2]
    assert scheduler.num_preemptions == 2
    run(scheduler)


def test_abort_waiting_and_running_requests():
    scheduler = make_scheduler(max_num_seqs=1)
    running, waiting = make_seq(0), make_seq(1)
    scheduler.add(running)
    scheduler.add(waiting)
    batch, _ = scheduler.schedule()
    assert batch == [running]
    scheduler.postprocess(batch, [fake_next_token(running)])
    assert scheduler.abort(1) is waiting
    assert scheduler.abort(0) is running
    assert scheduler.abort(0) is None and scheduler.abort(99) is None
    assert running.finish_reason == waiting.finish_reason == "abort"
    assert running.status is waiting.status is SequenceStatus.FINISHED
    assert running.block_table == [] and scheduler.block_manager.num_free_blocks == 64
    assert not scheduler.has_unfinished() and not scheduler.running and not scheduler.waiting
    assert scheduler.schedule() == ([], False)


def test_an_impossible_request_is_rejected_at_add():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="need 5 blocks of 4 tokens, but the KV pool holds only 4 blocks"):
        scheduler.add(make_seq(0, prompt_len=10, max_tokens=10))
    # the largest request that fits (16 tokens of K/V: 10 prompt + 7 generated, the last never written) runs
    fits = make_seq(1, prompt_len=10, max_tokens=7)
    scheduler.add(fits)
    run(scheduler)
    assert fits.num_output_tokens == 7
    # a preempted request is prefilled again with everything it generated: that must fit the token budget
    with pytest.raises(ValueError, match="prefill of 33 tokens .* max_num_batched_tokens is 32"):
        make_scheduler(max_num_batched_tokens=32).add(make_seq(2, prompt_len=30, max_tokens=4))
    with pytest.raises(ValueError, match="has encoder tokens, but this scheduler has no cross pool"):
        scheduler.add(make_seq(3, encoder_len=3))


def test_a_request_larger_than_the_cross_pool_is_rejected():
    scheduler = make_scheduler(cross_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="20 encoder tokens need 5 cross blocks, .* holds only 4"):
        scheduler.add(make_seq(0, encoder_len=20))
    with pytest.raises(ValueError, match="has no encoder tokens"):
        scheduler.add(make_seq(1))


def test_duplicate_request_ids_are_rejected():
    scheduler = make_scheduler()
    scheduler.add(make_seq(0))
    with pytest.raises(ValueError, match="already queued or running"):
        scheduler.add(make_seq(0))


def test_eos_and_length_finishing():
    scheduler = make_scheduler()
    stops_at_eos = make_seq(0, max_tokens=10)
    ignores_eos = make_seq(1, max_tokens=4, ignore_eos=True)
    runs_to_length = make_seq(2, max_tokens=3)
    for seq in (stops_at_eos, ignores_eos, runs_to_length):
        scheduler.add(seq)

    def next_token(seq):   # the first two requests are offered EOS as their third token
        if seq.request_id in (0, 1) and seq.num_output_tokens == 2:
            return EOS
        return 20 + seq.num_output_tokens

    run(scheduler, next_token)
    assert stops_at_eos.finish_reason == "eos" and stops_at_eos.output_token_ids == [20, 21]
    assert ignores_eos.finish_reason == "length" and ignores_eos.output_token_ids == [20, 21, EOS, 23]
    assert runs_to_length.finish_reason == "length" and runs_to_length.output_token_ids == [20, 21, 22]


def test_finish_with_a_stop_string_and_reason_override():
    scheduler = make_scheduler()
    seq = make_seq(0, max_tokens=1)
    scheduler.add(seq)
    batch, _ = scheduler.schedule()
    scheduler.postprocess(batch, [30])
    assert seq.finish_reason == "length"
    scheduler.finish(seq, "stop")                  # the facade found a stop string in the last token
    assert seq.finish_reason == "stop" and scheduler.block_manager.num_free_blocks == 64
    with pytest.raises(ValueError, match="unknown finish reason"):
        scheduler.finish(seq, "done")


def test_cross_blocks_follow_the_sequence():
    scheduler = make_scheduler(num_blocks=4, block_size=4, cross_blocks=6, max_num_seqs=2)
    a = make_seq(0, prompt_len=4, max_tokens=8, encoder_len=10)
    b = make_seq(1, prompt_len=4, max_tokens=8, encoder_len=5)
    scheduler.add(a)
    scheduler.add(b)
    batch, is_prefill = scheduler.schedule()
    assert is_prefill and batch == [a, b]
    assert a.cross_block_table == [0, 1, 2] and b.cross_block_table == [3, 4]
    while scheduler.num_preemptions == 0:
        scheduler.postprocess(batch, [fake_next_token(seq) for seq in batch])
        batch, _ = scheduler.schedule()
    assert b.cross_block_table == [] and scheduler.cross_block_manager.num_free_blocks == 3
    scheduler.postprocess(batch, [fake_next_token(seq) for seq in batch])
    run(scheduler)
    assert scheduler.cross_block_manager.num_free_blocks == 6


def test_prefix_caching_within_the_scheduler():
    scheduler = make_scheduler(prefix_caching=True, max_num_seqs=1)
    shared = [7] * 9
    first = Sequence(0, "", shared, SamplingParams(temperature=0, max_tokens=2))
    second = Sequence(1, "", shared, SamplingParams(temperature=0, max_tokens=2))
    scheduler.add(first)
    scheduler.add(second)
    batch, _ = scheduler.schedule()
    assert batch == [first] and first.num_cached_tokens == 0
    run(scheduler)
    assert scheduler.block_manager.num_hit_blocks == 2     # 8 of the second prompt's 9 tokens were cached
    assert second.token_ids == first.token_ids


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="max_tokens must be at least 1, got 0"):
        SamplingParams(temperature=0, max_tokens=0)
    with pytest.raises(ValueError, match="temperature must be 0 .greedy. or between"):
        SamplingParams(temperature=-0.5)
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(temperature=0, stop=[""])
    with pytest.raises(TypeError, match="a str, a list of str or None"):
        SamplingParams(temperature=0, stop=5)
    assert SamplingParams(stop="\n").stop == ("\n",)          # one string is one stop string, as in vLLM


def test_seeded_generator_does_not_depend_on_the_batch():
    torch = pytest.importorskip("torch")
    greedy = Sequence(0, "", [1], SamplingParams(temperature=0))
    assert greedy.generator is None
    seeded = [Sequence(i, "", [1], SamplingParams(temperature=0.7, seed=5)) for i in range(2)]
    draws = [torch.rand(3, generator=seq.generator) for seq in seeded]
    assert torch.equal(draws[0], draws[1])
    unseeded = [Sequence(i, "", [1], SamplingParams(temperature=0.7), default_seed=3) for i in (0, 1, 0)]
    draws = [torch.rand(3, generator=seq.generator) for seq in unseeded]
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])
