from pearl_sglang.workload.trace import BAMBOO_P3, mean_workers, read_bamboo, worker_targets

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
    assert [(t.t_s, t.workers) for t in targets] == [(0.0, 3), (60.0, 6), (120.0, 4)]
    seg = worker_targets(read_bamboo(trace), max_workers=6, start_s=30, length_s=60)
    assert [(t.t_s, t.workers) for t in seg] == [(0.0, 3), (30.0, 6)]
    assert mean_workers(seg, 60) == 4.5
