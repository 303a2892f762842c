"""Hypothesis strategies shared by the core tests (profiles, tables)."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from pearl_sglang.core.profile import Profile
from pearl_sglang.core.state import Activity, OverlapOwner, Role, StateTable, WorkerRecord, Zone, check
from pearl_sglang.core.topology import Topology

ROLES = (Role.PREFILL, Role.DECODE, Role.COLOCATED)


def profiles() -> st.SearchStrategy[Profile]:
    f = st.floats
    return st.builds(
        Profile,
        B=st.integers(1, 128).map(float),
        S=f(1, 60),
        delta_L=f(0, 20_000),
        r=f(1, 2_000),
        theta=f(0, 5),
        A=f(1e-4, 0.05),
        b=f(0, 1e-3),
        t_prefill=f(0, 1e-4),
        K=f(0, 3e5),
        BW=f(1e9, 1e12),
        T_over=f(0, 2),
        T_env=f(0, 500),
        K_seq=f(0, 1e10),
        H_max=f(1e9, 2e11),
    )


def topologies(max_total: int) -> st.SearchStrategy[Topology]:
    """Any counts, valid or not (current topologies can be broken)."""
    n = st.integers(0, max_total)
    return st.builds(Topology, prefill=n, decode=n, colocated=n).filter(lambda t: t.total <= max_total)


def valid_targets(max_total: int) -> st.SearchStrategy[Topology]:
    coloc = st.integers(1, max(1, max_total)).map(Topology.coloc)
    pd = st.tuples(st.integers(1, max_total), st.integers(1, max_total)).filter(
        lambda x: x[0] + x[1] <= max_total).map(lambda x: Topology.pd(*x))
    return coloc | pd if max_total >= 2 else coloc


@st.composite
def tables(draw, max_groups: int = 8) -> StateTable:
    """A valid table with at most ``max_groups`` GPU groups (each free or bound)."""
    tp = draw(st.integers(1, 2))
    owner = draw(st.sampled_from(list(OverlapOwner)))
    n_groups = draw(st.integers(max(1, max_groups // 2), max_groups) | st.integers(1, max_groups))
    dedicated: set[str] = set()
    overlap: set[str] = set()
    workers: list[WorkerRecord] = []
    slots = iter(draw(st.permutations(range(max_groups + 2))))
    # Often start from a serving PD pair, so losing one side of it gets exercised.
    if n_groups >= 2 and draw(st.booleans()):
        for g, role in ((0, Role.PREFILL), (1, Role.DECODE)):
            gpus = tuple(f"d{g}:{i}" for i in range(tp))
            dedicated.update(gpus)
            workers.append(WorkerRecord(next(slots), gpus, Zone.DEDICATED, role, Activity.ACTIVE))
    for g in range(len(workers), n_groups):
        zone = draw(st.sampled_from([Zone.DEDICATED, Zone.OVERLAP]))
        gpus = tuple(f"{zone.value[0]}{g}:{i}" for i in range(tp))
        kind = draw(st.sampled_from(["worker", "worker", "free"]))
        if zone is Zone.OVERLAP:
            overlap.update(gpus)
            if kind == "free":
                continue
            if owner is OverlapOwner.TRAINING:
                acts = [Activity.INACTIVE]
            elif owner is OverlapOwner.RETURNING:
                acts = [Activity.INACTIVE, Activity.LEAVING]
            else:
                acts = list(Activity)
        else:
            reclaimed = kind == "worker" and draw(st.booleans()) and draw(st.booleans())
            if not reclaimed:
                dedicated.update(gpus)
            if kind == "free":
                continue
            acts = [Activity.LEAVING] if reclaimed else [a for a in Activity if a is not Activity.INACTIVE]
        # Weight ACTIVE so that servable PD pairs and mixes are common.
        activity = draw(st.sampled_from(acts + [Activity.ACTIVE] * 3 if Activity.ACTIVE in acts else acts))
        role = draw(st.sampled_from(ROLES))
        pending = draw(st.sampled_from(ROLES)) if activity is Activity.SWITCHING else None
        workers.append(WorkerRecord(next(slots), gpus, zone, role, activity, pending))
    # Repair a lone prefill or decode pool the way events do: hold it.
    table = StateTable(tp, frozenset(dedicated), frozenset(overlap), owner, tuple(workers))
    topo = table.active_topology()
    if (topo.prefill >= 1) != (topo.decode >= 1):
        lonely = Role.PREFILL if topo.prefill else Role.DECODE
        workers = [replace(w, activity=Activity.SWITCHING, pending_role=w.role)
                   if w.activity is Activity.ACTIVE and w.role is lonely else w for w in workers]
        table = StateTable(tp, frozenset(dedicated), frozenset(overlap), owner, tuple(workers))
    return check(table)
