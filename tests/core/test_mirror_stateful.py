"""A hypothesis state machine: a mirror following a reference hash through lossy delivery.

The reference is the Redis hash with its revision. Each write bumps the revision and publishes a
delta (and, as a script reply may, the full state). Deliveries can be late, duplicated, reordered
or lost. A load reads the reference at some moment between its start and its completion (its
HGETALL runs while later changes may already be on their way); loads may complete in any order.

Whatever happens: a loaded copy is the reference at its own revision; an unloaded copy always has
a load coming; and once no load is in flight and every change is accounted for (delivered, or
covered by a completed load or full state), the copy is the reference.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from outpost_core import Customer
from outpost_core._changes import Change
from outpost_core._mirror import Mirror, Offer

KEY = "outpost:v1:{0}:external:c1:r1"
FIELDS = ["n", "u", "cu", "a:0", "a:300", "c:m"]


def without_rev(fields: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in fields.items() if name != "rev"}


class MirrorFollowsTheHash(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mirror = Mirror(KEY, Customer("external", "c1"), "r1")
        self.rev = 0
        self.fields: dict[str, str] = {}
        self.history: dict[int, dict[str, str]] = {0: {}}
        self.in_flight: list[Change] = []
        self.delivered: set[int] = set()
        self.covered = 0  # every revision up to this one reached the copy through a load or full
        # Loads in flight: None until the HGETALL runs, then the revision it read.
        self.loads: list[int | None] = [None]  # following an identity starts with a load

    # -- the reference hash ----------------------------------------------------------------------

    @rule(
        writes=st.dictionaries(
            st.sampled_from(FIELDS), st.none() | st.text("0123 -", max_size=4), max_size=3
        ),
        reply_full=st.booleans(),
    )
    def write(self, writes: dict[str, str | None], reply_full: bool) -> None:
        self.rev += 1
        pairs = tuple((k, v) for k, v in writes.items() if v is not None)
        deleted = tuple(k for k, v in writes.items() if v is None)
        self.fields.update(pairs)
        for name in deleted:
            self.fields.pop(name, None)
        self.history[self.rev] = dict(self.fields)
        self.in_flight.append(Change(key=KEY, rev=self.rev, set=pairs, deleted=deleted))
        if reply_full:
            state = (("rev", str(self.rev)), *self.fields.items())
            self.in_flight.append(Change(key=KEY, rev=self.rev, set=state, full=True))

    # -- delivery --------------------------------------------------------------------------------

    def _offer(self, change: Change) -> None:
        was_loaded, rev = self.mirror.loaded, self.mirror.rev
        outcome = self.mirror.offer(change)
        if change.set is None:
            # A bare reply newer than a loaded copy makes it reload; anything else is ignored.
            if was_loaded and change.rev > rev:
                assert outcome is Offer.GAP
                self.loads.append(None)
            else:
                assert outcome is Offer.IGNORED
            return
        if change.full:
            self.covered = max(self.covered, change.rev)
        else:
            self.delivered.add(change.rev)
        if outcome is Offer.GAP:
            self.loads.append(None)  # the session asks for a load
        if outcome is Offer.HELD:
            assert not self.mirror.loaded

    @precondition(lambda self: self.in_flight)
    @rule(index=st.integers(min_value=0), duplicate=st.booleans())
    def deliver(self, index: int, duplicate: bool) -> None:
        position = index % len(self.in_flight)
        change = self.in_flight[position] if duplicate else self.in_flight.pop(position)
        self._offer(change)

    @precondition(lambda self: self.in_flight)
    @rule(index=st.integers(min_value=0))
    def lose(self, index: int) -> None:
        self.in_flight.pop(index % len(self.in_flight))

    @precondition(lambda self: self.rev > 0)
    @rule(back=st.integers(min_value=0, max_value=5))
    def deliver_bare_reply(self, back: int) -> None:
        # A reply to a caller that did not follow the identity: key and revision only.
        self._offer(Change(key=KEY, rev=max(self.rev - back, 0), set=None))

    # -- loads -----------------------------------------------------------------------------------

    @rule()
    def restart_subscriber(self) -> None:
        self.mirror.unload()
        self.loads.append(None)

    @rule()
    def start_extra_load(self) -> None:
        self.loads.append(None)  # a retried load, or one asked twice

    @precondition(lambda self: None in self.loads)
    @rule()
    def run_hgetall(self) -> None:
        self.loads[self.loads.index(None)] = self.rev

    @precondition(lambda self: self.loads)
    @rule(index=st.integers(min_value=0))
    def complete_load(self, index: int) -> None:
        read = self.loads.pop(index % len(self.loads))
        rev = self.rev if read is None else read  # not run yet: it runs now
        fields = {"rev": str(rev), **self.history[rev]}
        complete = self.mirror.loaded_with(fields)
        if read is None:
            # The reference as it is now is at least as new as anything in flight.
            assert complete
        if not complete:
            self.loads.append(None)  # the session loads again
        self.covered = max(self.covered, rev)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def a_loaded_copy_is_the_reference_at_its_revision(self) -> None:
        if self.mirror.loaded:
            assert 0 <= self.mirror.rev <= self.rev
            assert without_rev(self.mirror.fields) == self.history[self.mirror.rev]

    @invariant()
    def an_unloaded_copy_has_a_load_coming(self) -> None:
        if not self.mirror.loaded:
            assert self.loads

    @invariant()
    def held_changes_only_wait_for_a_load(self) -> None:
        if self.mirror.held:
            assert not self.mirror.loaded

    @invariant()
    def a_copy_that_missed_nothing_is_current(self) -> None:
        accounted = all(r <= self.covered or r in self.delivered for r in range(1, self.rev + 1))
        if self.mirror.loaded and not self.mirror.held and not self.loads and accounted:
            assert self.mirror.rev == self.rev
            assert without_rev(self.mirror.fields) == self.fields
            state = self.mirror.state
            assert state.revision == self.rev


MirrorFollowsTheHash.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
test_mirror_follows_the_hash = MirrorFollowsTheHash.TestCase
