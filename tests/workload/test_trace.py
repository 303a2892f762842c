from pearl_sglang.workload.trace import BAMBOO_P3, mean_workers, read_bamboo, scaled_workers, worker_targets

TRACE = BAMBOO_P3


def test_reads_the_bamboo_trace():
    points = read_bamboo(TRACE)
    assert max(p.live for p in points) == 32
    assert points[0].t_s == 0 and points[-1].t_s == 40920.0
    assert all(a.t_s < b.t_s for a, b in zip(points, points[1:]))


def test_scaling_to_six_workers(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,n1\r\n0,add,n2\r\n60000,add,n3\r\n60000,add,n4\r\n120000,remove,n1\r\n")
    targets = worker_targets(read_bamboo(trace), max_workers=6)
    assert [(t.t_s, t.workers) for t in targets] == [(0.0, 3), (60.0, 6), (120.0, 5)]  # 4.5 rounds up
    seg = worker_targets(read_bamboo(trace), max_workers=6, start_s=30, length_s=60)
    assert [(t.t_s, t.workers) for t in seg] == [(0.0, 3), (30.0, 6)]
    assert mean_workers(seg, 60) == 4.5


def test_a_window_before_the_first_event_starts_from_no_workers(tmp_path):
    trace = tmp_path / "t.csv"
    rows = [f"480000,add,n{i}" for i in range(10)] + ["900000,remove,n0", "900000,remove,n1"]
    trace.write_text("\n".join(rows) + "\n")
    targets = worker_targets(read_bamboo(trace), max_workers=5, start_s=0, length_s=3600)
    assert [(t.t_s, t.workers) for t in targets] == [(0.0, 0), (480.0, 5), (900.0, 4)]
    # A window that starts between events starts from the count of the last one before it.
    later = worker_targets(read_bamboo(trace), max_workers=5, start_s=600, length_s=600)
    assert [(t.t_s, t.workers) for t in later] == [(0.0, 5), (300.0, 4)]
    assert mean_workers(targets, 3600) == (5 * 420 + 4 * 2700) / 3600


def test_scaling_rounds_half_up_into_even_bins():
    # peak 8 onto 4 workers: half a worker is one live instance; halves round up.
    assert [scaled_workers(live, peak=8, max_workers=4) for live in range(9)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    # peak 32 onto 4 workers: every count from 1 to 3 covers 8 live instances, 0 and 4 half of that.
    counts = [scaled_workers(live, peak=32, max_workers=4) for live in range(33)]
    assert [counts.count(k) for k in range(5)] == [4, 8, 8, 8, 5]
    # p3 onto 6 workers: the one tie that half-to-even rounded down is 24 live (4.5 workers).
    assert [live for live in range(33)
            if scaled_workers(live, peak=32, max_workers=6) != round(live * 6 / 32)] == [24]
