"""Synthetic workloads whose ideal hit rate is known in closed form.

Each generator returns a :class:`~pagedkv.sim.workloads.Workload` of real token ids (the
manager hashes them) and an analytic *ideal* hit rate: the hit rate of an infinite cache
with block-granular prefix caching, ``Workload.ideal_hit_rate(block_size, mode)``:

* every prompt is looked up once; a hit is block aligned and covers at most
  ``prompt - 1`` tokens (the last prompt token is always recomputed);
* ``"pure-cache"`` mode stores the full blocks of each prompt only;
* ``"engine"`` mode also stores the full blocks written while decoding: a request that
  generated ``A`` tokens leaves ``floor((prompt + A - 1) / b)`` full blocks (the last
  generated token is never fed back), which matters when a reply reappears in a later
  prompt (multi-turn, agents). It assumes the capacity holds everything and a later turn
  arrives after the previous one finished (guaranteed: turns are chained by ``parent``).

Token layout: a prompt is a sequence of *segments* (a system prompt, a question, a reply,
an observation); segment ``k`` is ``k`` repeated ``length`` times. Equal segments are
shared on purpose; distinct segments start with distinct tokens, so chained block hashes
never share a block by accident.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedkv.checks import check_number, check_whole
from pagedkv.cli_args import MAX_SECONDS
from pagedkv.errors import InvalidArgumentError
from pagedkv.sim.workloads import SimRequest, Workload

__all__ = ["agent_loops", "multi_turn", "system_prompts"]


#: Most requests one generator builds, and most tokens in one segment: more is a typo
#: (the workload is built in memory before the replay starts).
MAX_GENERATED_REQUESTS = 10_000_000
MAX_SEGMENT_TOKENS = 10_000_000
#: Most prompt tokens, summed over the requests, one generator builds (about 4 GB of ids).
MAX_GENERATED_TOKENS = 500_000_000


def _check(prompt_tokens: Callable[[], int], **values: float) -> None:
    """Counts and lengths are whole numbers >= 1, times finite seconds >= 0 (at most
    :data:`~pagedkv.cli_args.MAX_SECONDS`); the counts' product is at most
    :data:`MAX_GENERATED_REQUESTS`."""
    requests = 1
    for name, v in values.items():
        if name.endswith("_s"):
            check_number(name, v, minimum=0, maximum=MAX_SECONDS)
        elif name.startswith("num_"):
            requests *= check_whole(name, v, minimum=1, maximum=MAX_GENERATED_REQUESTS)
        else:
            check_whole(name, v, minimum=1, maximum=MAX_SEGMENT_TOKENS)
    if requests > MAX_GENERATED_REQUESTS:
        raise InvalidArgumentError(
            f"{requests:,} requests is more than a generator builds "
            f"({MAX_GENERATED_REQUESTS:,}); lower the counts")
    total = prompt_tokens()
    if total > MAX_GENERATED_TOKENS:
        raise InvalidArgumentError(
            f"{total:,} prompt tokens in all is more than a generator builds "
            f"({MAX_GENERATED_TOKENS:,}); lower the counts or lengths")


def _chat_tokens(sessions: int, turns: int, first: int, per_turn: int) -> int:
    """Prompt tokens of ``sessions`` chats of ``turns`` turns: turn t is ``first + t *
    per_turn`` tokens long."""
    return sessions * (turns * first + turns * (turns - 1) // 2 * per_turn)


def _floor(n: int, b: int) -> int:
    return n // b * b


class _Segments:
    def __init__(self) -> None:
        self.next_id = 1

    def new(self, length: int) -> tuple[int, ...]:
        seg = (self.next_id,) * length
        self.next_id += 1
        return seg


def system_prompts(
    *,
    num_groups: int = 4,
    questions_per_group: int = 64,
    system_tokens: int = 1536,
    question_tokens: int = 200,
    output_tokens: int = 64,
    interval_s: float = 0.05,
) -> Workload:
    """``num_groups`` system prompts, each followed by ``questions_per_group`` distinct
    questions; requests interleave the groups (question-major) and arrive every
    ``interval_s`` seconds.

    Ideal (both modes), block size ``b``: every request but the first of its group hits the
    system prompt's full blocks::

        G (Q - 1) floor(S / b) b / (G Q (S + U))

    e.g. G=4, Q=64, S=1536, U=200, b=16: 4*63*1536 / (4*64*1736) = 0.8710.
    """
    _check(lambda: num_groups * questions_per_group * (system_tokens + question_tokens),
           num_groups=num_groups, num_questions=questions_per_group,
           system_tokens=system_tokens, question_tokens=question_tokens,
           output_tokens=output_tokens, interval_s=interval_s)
    seg = _Segments()
    systems = [seg.new(system_tokens) for _ in range(num_groups)]
    reqs: list[SimRequest] = []
    for q in range(questions_per_group):
        for g in range(num_groups):
            prompt = systems[g] + seg.new(question_tokens)
            reqs.append(SimRequest(
                request_id=f"g{g}q{q}", arrival_s=len(reqs) * interval_s,
                num_prompt_tokens=len(prompt), num_output_tokens=output_tokens,
                prompt_token_ids=prompt, output_token_ids=seg.new(output_tokens),
            ))

    def ideal(block_size: int, mode: str) -> float:
        hit = num_groups * (questions_per_group - 1) * _floor(system_tokens, block_size)
        return hit / (num_groups * questions_per_group * (system_tokens + question_tokens))

    return Workload(
        name="system-prompts", requests=tuple(reqs), ideal_hit_rate_fn=ideal,
        description=(
            f"{num_groups} system prompts of {system_tokens} tokens x {questions_per_group} "
            f"questions of {question_tokens} tokens, {output_tokens} output tokens each"
        ),
    )


def _chats(
    name: str,
    description: str,
    *,
    num_sessions: int,
    num_turns: int,
    shared_tokens: int,
    first_tokens: int,
    message_tokens: int,
    output_tokens: int,
    interval_s: float,
    think_s: float,
) -> Workload:
    """Sessions of chained turns: turn t's prompt is the shared prefix, the first message,
    then (reply, message) pairs of every earlier turn."""
    seg = _Segments()
    shared = seg.new(shared_tokens)
    reqs: list[SimRequest] = []
    history = [shared + seg.new(first_tokens) for _ in range(num_sessions)]
    last_index: list[int | None] = [None] * num_sessions
    for t in range(num_turns):
        for c in range(num_sessions):
            if t:
                history[c] += seg.new(message_tokens)
            reply = seg.new(output_tokens)
            prompt = history[c]
            reqs.append(SimRequest(
                request_id=f"s{c}t{t}", arrival_s=c * interval_s + t * think_s,
                num_prompt_tokens=len(prompt), num_output_tokens=output_tokens,
                prompt_token_ids=prompt, output_token_ids=reply,
                parent=last_index[c], think_s=think_s if t else 0.0,
            ))
            last_index[c] = len(reqs) - 1
            history[c] = prompt + reply
    order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival_s)
    if order != list(range(len(reqs))):  # keep parents before children, renumbered
        pos = {old: new for new, old in enumerate(order)}
        reqs = [_reparent(reqs[i], pos) for i in order]

    def ideal(block_size: int, mode: str) -> float:
        b = block_size
        hits = 0
        total = 0
        for t in range(num_turns):
            p = shared_tokens + first_tokens + t * (output_tokens + message_tokens)
            total += num_sessions * p
            if t == 0:
                hits += (num_sessions - 1) * _floor(shared_tokens, b)
                continue
            prev = p - output_tokens - message_tokens
            kept = prev + output_tokens - 1 if mode == "engine" else prev
            hits += num_sessions * min(_floor(kept, b), _floor(p - 1, b))
        return hits / total

    return Workload(name=name, requests=tuple(reqs), ideal_hit_rate_fn=ideal,
                    description=description)


def _reparent(r: SimRequest, pos: dict[int, int]) -> SimRequest:
    return SimRequest(
        request_id=r.request_id, arrival_s=r.arrival_s, num_prompt_tokens=r.num_prompt_tokens,
        num_output_tokens=r.num_output_tokens, prompt_token_ids=r.prompt_token_ids,
        output_token_ids=r.output_token_ids,
        parent=None if r.parent is None else pos[r.parent], think_s=r.think_s,
    )


def multi_turn(
    *,
    num_conversations: int = 32,
    num_turns: int = 6,
    system_tokens: int = 600,
    user_tokens: int = 150,
    output_tokens: int = 250,
    interval_s: float = 0.5,
    think_s: float = 5.0,
) -> Workload:
    """Chat sessions: turn t's prompt = the shared system prompt + the whole conversation
    so far + a new user message; the next turn arrives ``think_s`` after the reply ends.

    Ideal, block size ``b``, ``p_t = S + U + t (A + U)`` (t from 0): turn 0 of every
    conversation but the first hits ``floor(S / b) b``; turn t > 0 hits
    ``floor(p_{t-1} / b) b`` in pure-cache mode, ``floor((p_{t-1} + A - 1) / b) b`` in
    engine mode (the reply's blocks were cached while decoding).
    """
    _check(lambda: _chat_tokens(num_conversations, num_turns, system_tokens + user_tokens,
                                user_tokens + output_tokens),
           num_sessions=num_conversations, num_turns=num_turns, system_tokens=system_tokens,
           user_tokens=user_tokens, output_tokens=output_tokens, interval_s=interval_s,
           think_s=think_s)
    return _chats(
        "multi-turn",
        f"{num_conversations} conversations x {num_turns} turns, system prompt "
        f"{system_tokens}, user messages {user_tokens}, replies {output_tokens} tokens",
        num_sessions=num_conversations, num_turns=num_turns, shared_tokens=system_tokens,
        first_tokens=user_tokens, message_tokens=user_tokens, output_tokens=output_tokens,
        interval_s=interval_s, think_s=think_s,
    )


def agent_loops(
    *,
    num_agents: int = 16,
    num_steps: int = 12,
    tool_prefix_tokens: int = 6000,
    task_tokens: int = 400,
    observation_tokens: int = 300,
    action_tokens: int = 120,
    interval_s: float = 1.0,
    think_s: float = 0.5,
) -> Workload:
    """Agents sharing one long tool/system prefix, each running ``num_steps`` short steps:
    step t's prompt = prefix + task + every earlier (action, observation) pair; the
    observation (tool result) comes back ``think_s`` after the action ends.

    Ideal: as :func:`multi_turn` with ``S`` = the tool prefix, the first message = the
    task, later messages = observations and replies = actions.
    """
    _check(lambda: _chat_tokens(num_agents, num_steps, tool_prefix_tokens + task_tokens,
                                observation_tokens + action_tokens),
           num_sessions=num_agents, num_turns=num_steps, shared_tokens=tool_prefix_tokens,
           task_tokens=task_tokens, observation_tokens=observation_tokens,
           action_tokens=action_tokens, interval_s=interval_s, think_s=think_s)
    return _chats(
        "agent",
        f"{num_agents} agents x {num_steps} steps, tool prefix {tool_prefix_tokens}, task "
        f"{task_tokens}, observations {observation_tokens}, actions {action_tokens} tokens",
        num_sessions=num_agents, num_turns=num_steps, shared_tokens=tool_prefix_tokens,
        first_tokens=task_tokens, message_tokens=observation_tokens,
        output_tokens=action_tokens, interval_s=interval_s, think_s=think_s,
    )


GENERATORS: dict[str, Callable[..., Workload]] = {
    "system-prompts": system_prompts,
    "multi-turn": multi_turn,
    "agent": agent_loops,
}
