"""CERAR against exact references: numpy's float64 sum and the protocol's closed-form error."""

import numpy as np
import pytest

import gradsync
from gradsync import ConfigError, ScheduleError, Schedule
from gradsync.coding import cerar
from gradsync.model.cost import predict
from gradsync.model.simulate import simulate
from gradsync.model.topology import preset


def rel_errors(estimates, inputs):
    exact = inputs.astype(np.float64).sum(axis=0)
    return np.linalg.norm(estimates.astype(np.float64) - exact, axis=1) / max(np.linalg.norm(exact), 1e-300)


def summation_errors(estimates, inputs):
    """Error relative to ||sum |x_i| ||, the condition of a floating-point sum (as for the exact
    algorithms): for lengths of 1-10 the sum itself can be near zero by chance."""
    exact = inputs.astype(np.float64).sum(axis=0)
    scale = np.linalg.norm(np.abs(inputs.astype(np.float64)).sum(axis=0))
    return np.linalg.norm(estimates.astype(np.float64) - exact, axis=1) / scale


@pytest.mark.parametrize("workers", range(2, 17))
def test_exact_when_components_at_most_workers(workers, rng):
    for components in sorted({1, 2, workers // 2 or 1, workers - 1 or 1, workers}):
        for length in (0, 1, components + 1, 7 * components + 3):
            for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
                inputs = rng.standard_normal((workers, length)).astype(dtype)
                out = gradsync.emulate("cerar", inputs, components=components)
                assert out.shape == inputs.shape and out.dtype == inputs.dtype
                if length:
                    assert summation_errors(out, inputs).max() < tol, (components, length, dtype)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_exact_case_relative_l2_error_on_long_gradients(dtype, tol, rng):
    inputs = rng.standard_normal((16, 1 << 16)).astype(dtype)
    for components in (5, 8, 16):
        assert rel_errors(gradsync.emulate("cerar", inputs, components=components), inputs).max() < tol


def reference_estimates(design, inputs):
    """Worker j's estimate from the derivation alone: per mode, S + (x^-N - 1) B_j (scale none)."""
    n, d = inputs.shape
    g = cerar.split(inputs, design.components)
    mode, imag = design._columns
    h = np.zeros((n, len(design.points), g.shape[-1]), complex)
    np.add.at(h, (slice(None), mode[~imag]), g[:, ~imag])
    np.add.at(h, (slice(None), mode[imag]), 1j * g[:, imag])
    q = design.points[:, None] ** (-float(n))
    out = np.empty((n, design.components, g.shape[-1]))
    for j in range(n):
        est = h.sum(axis=0) + (q - 1) * h[j + 1:].sum(axis=0)
        out[j, ~imag] = est[mode[~imag]].real
        out[j, imag] = est[mode[imag]].imag
    return out.reshape(n, -1)[:, :d]


@pytest.mark.parametrize("workers,components,eps", [(3, 5, 1e-3), (4, 8, 1e-3), (5, 12, 1e-2), (8, 20, 1e-3),
                                                    (6, 6, None), (7, 3, None)])
def test_estimates_match_the_closed_form_error(workers, components, eps, rng):
    design = cerar.unity(workers, components, eps)
    inputs = rng.standard_normal((workers, 53))
    expected = reference_estimates(design, inputs)
    assert np.abs(cerar.emulate(design, inputs) - expected).max() < 1e-9 * max(1.0, design.cond) * np.abs(expected).max()


@pytest.mark.parametrize("workers,components", [(2, 2), (4, 8), (5, 7), (8, 16), (16, 48)])
@pytest.mark.parametrize("elements", [1, 99, 1000])
def test_every_worker_sends_L_packets_of_m(workers, components, elements, rng):
    m = -(-elements // components)
    rounds = components + workers - 2
    # what is sent does not depend on accuracy: (16, 48) is beyond float32's default max_error
    s = gradsync.schedule("cerar", workers, elements, components=components, max_error=1.0)
    gradsync.verify(s)
    assert s.elements_sent().tolist() == [rounds * m] * workers
    assert sorted(set(s.transfers["round"].tolist())) == list(range(1, rounds + 1))
    ran = cerar.run(cerar.Design.from_dict(s.codec), rng.standard_normal((workers, elements)))
    assert ran.sent_elements.tolist() == [rounds * m] * workers


def fit_slope(xs, ys):
    return np.polyfit(np.log(xs), np.log(ys), 1)[0]


@pytest.mark.parametrize("workers,components", [(4, 8), (8, 16), (4, 12), (6, 18)])
def test_error_is_order_eps_and_cond_order_eps_to_minus_r(workers, components, rng):
    r = -(-components // workers) - 1
    eps = np.geomspace(1e-5, 1e-3, 5) if r == 1 else np.geomspace(1e-3, 1e-2, 5)
    inputs = rng.standard_normal((workers, 4096))
    errors = [rel_errors(cerar.emulate(cerar.unity(workers, components, e), inputs), inputs).max() for e in eps]
    conds = [cerar.unity(workers, components, e).cond for e in eps]
    assert fit_slope(eps, errors) == pytest.approx(1.0, abs=0.1)
    assert fit_slope(eps, conds) == pytest.approx(-r, abs=0.15)


@pytest.mark.parametrize("workers,components", [(4, 6), (4, 8), (8, 12), (8, 16), (8, 24), (16, 32)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_optimized_is_never_worse_than_unity_at_the_same_condition_bound(workers, components, dtype):
    bound = cerar.default_max_cond(workers, components, dtype)
    baseline = cerar.unity_at_cond(workers, components, bound)
    best = cerar.optimized(workers, components, bound, dtype)
    assert best.cond <= bound * 1.0001
    assert best.predicted_error(dtype) <= baseline.predicted_error(dtype)
    assert cerar.measure(best, dtype=dtype)["rel_error"] <= cerar.measure(baseline, dtype=dtype)["rel_error"]


def test_per_worker_scale_makes_the_end_workers_exact(rng):
    design = cerar.unity(6, 12, 1e-3, scale="per_worker")
    inputs = rng.standard_normal((6, 600))
    errors = rel_errors(cerar.emulate(design, inputs), inputs)
    assert errors[0] < 1e-9 and errors[-1] < 1e-9 and errors[1:-1].min() > 1e-6


def test_workers_disagree_by_a_measured_amount():
    exact = cerar.measure(cerar.unity(8, 8))
    approx = cerar.measure(cerar.unity(8, 16, 1e-3))
    assert exact["worker_spread"] < 1e-13
    assert 1e-4 < approx["worker_spread"] <= 2 * approx["rel_error"]


def test_predicted_error_tracks_the_measured_one():
    for design, dtype in [(cerar.unity(8, 16, 1e-3), "float64"), (cerar.unity_best(8, 16, "float32"), "float32"),
                          (cerar.optimized(4, 8, 3e3, "float32"), "float32")]:
        measured = cerar.measure(design, dtype=dtype)["rel_error"]
        assert 0.5 < design.predicted_error(dtype) / measured < 2


@pytest.mark.parametrize("kwargs,message", [
    (dict(components=0), "components must be"),
    (dict(components=8, eps=0.0), "eps must be"),
    (dict(components=8, eps=-1e-3), "eps must be"),
    (dict(components=8, eps=1.5), "eps must be"),
    (dict(components=16, max_cond=2.0), "no unity design"),
    (dict(components=8, max_cond=1e300), "max_cond must be"),
    (dict(components=8, construction="magic"), "construction must be one of"),
    (dict(components=8, eps=1e-3, max_cond=1e4), "not both"),
])
def test_parameters_that_cannot_work_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        gradsync.schedule("cerar", 4, 100, **kwargs)


def test_integer_gradients_are_refused():
    with pytest.raises(ConfigError, match="float32 or float64"):
        gradsync.emulate("cerar", np.ones((4, 10), dtype=np.int32), components=4)


def test_a_tampered_cerar_schedule_fails_verification():
    s = gradsync.schedule("cerar", 4, 100, components=8, eps=1e-3)
    table = s.transfers.copy()
    table["dst"][3] = (table["src"][3] + 2) % 4
    with pytest.raises(ScheduleError, match="not a CERAR schedule"):
        gradsync.verify(Schedule("cerar", 4, 100, table, compute=s.compute, codec=s.codec))


@pytest.mark.parametrize("nbytes", [4096, 64 << 20])
@pytest.mark.parametrize("workers,components", [(4, 8), (8, 12)])
def test_simulator_charges_traffic_and_codec_work_as_the_closed_form(workers, components, nbytes):
    topo = preset("ethernet", workers)
    s = gradsync.schedule("cerar", workers, nbytes // 4, components=components)
    assert simulate(s, topo).time == pytest.approx(predict("cerar", topo, workers, nbytes, components=components), rel=0.01)


def test_design_survives_json_through_the_schedule():
    s = gradsync.schedule("cerar", 5, 333, construction="optimized", components=9)
    back = Schedule.from_json(s.to_json())
    x = np.random.default_rng(3).standard_normal((5, 333)).astype(np.float32)
    assert np.array_equal(gradsync.emulate(back, x), gradsync.emulate(s, x))
