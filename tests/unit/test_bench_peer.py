"""engine.bench_peer without a GPU: argument handling, the sdist stripping and wheel pieces, the build's
failure paths, and the ratio/roofline/projection arithmetic and tables (with made-up measurements)."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest

from engine.bench_peer import build, run
from engine.bench_peer.report import (
    LLAMA_CMP_PUBLISHED,
    compare_shape,
    decode_projection,
    markdown_table,
    matmul_ops_per_token,
    prefill_projection,
    rerender,
)
from engine.cuda.bench.cmp_model import CMP_READ_GBPS
from engine.cuda.bench.speed import CMP_DP4A_TOPS, decode_bytes
from engine.errors import RigllmError
from engine.gguf.shapes import shape_config


def test_parse_variant_plain_and_with_environment():
    assert run.parse_variant("default") == ("default", {})
    assert run.parse_variant("no-graphs:GGML_CUDA_DISABLE_GRAPHS=1,A=b=c") == (
        "no-graphs", {"GGML_CUDA_DISABLE_GRAPHS": "1", "A": "b=c"})


@pytest.mark.parametrize("bad", ["", ":X=1", "v:NOEQUALS", "v:=1"])
def test_parse_variant_rejects(bad):
    with pytest.raises(RigllmError):
        run.parse_variant(bad)


def test_parser_defaults_and_lists():
    args = run.parser().parse_args(["--prompts", "512,2048", "--out", "/tmp/x"])
    assert args.prompts == (512, 2048) and args.depths == (512, 18432) and args.out == Path("/tmp/x")
    assert args.variants is None and args.flash_attn == "auto"


@pytest.mark.parametrize("bad", ["", "a,b", "0", "-5"])
def test_parser_rejects_bad_lengths(bad, capsys):
    with pytest.raises(SystemExit):
        run.parser().parse_args(["--prompts", bad])


def _tarball(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            data = name.encode()
            info = tarfile.TarInfo(f"llama_cpp_python-0.3.36/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_strip_sdist_drops_only_unbuilt_folders(tmp_path):
    keep = ["CMakeLists.txt", "pyproject.toml", "llama_cpp/__init__.py", "vendor/llama.cpp/src/llama.cpp",
            "vendor/llama.cpp/ggml/src/ggml-cuda/mmq.cu", "vendor/llama.cpp/vendor/nlohmann/json.hpp",
            "vendor/llama.cpp/common/common.cpp", "vendor/llama.cpp/modelsX/keep.txt"]
    drop = ["vendor/llama.cpp/models/ggml-vocab-qwen35.gguf", "vendor/llama.cpp/docs/build.md",
            "vendor/llama.cpp/ggml/src/ggml-vulkan/x.cpp", "vendor/llama.cpp/tools/llama-bench/llama-bench.cpp",
            ".git/objects/pack/p.pack", "docs/index.md", "tests/test_llama.py"]
    out = build.strip_sdist(_tarball(tmp_path / "s.tar.gz", keep + drop), tmp_path / "stripped.tar.gz")
    with tarfile.open(out) as tar:
        names = {m.name.split("/", 1)[1] for m in tar.getmembers()}
        assert tar.extractfile("llama_cpp_python-0.3.36/CMakeLists.txt").read() == b"CMakeLists.txt"
    assert names == set(keep)


def test_wheel_pieces_round_trip_and_newest_wheel(tmp_path):
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    payload = bytes(range(256)) * 1000
    wheel.write_bytes(payload)
    pieces = build.split_file(wheel, tmp_path / "out", part_bytes=100_000)
    assert [p.name[-6:] for p in pieces] == ["part00", "part01", "part02"]
    assert build.find_wheel(tmp_path / "out").read_bytes() == payload
    assert build.find_wheel(tmp_path / "missing") is None


def test_build_refuses_a_missing_sdist(tmp_path):
    with pytest.raises(RigllmError, match="sdist not found"):
        build.build_wheel(tmp_path / "nope.tar.gz", tmp_path / "w", tmp_path / "log", 5)


@pytest.mark.parametrize("script, expect", [("print('boom'); import sys; sys.exit(3)", "rc=3"),
                                            ("import time; time.sleep(30)", "rc=timeout")])
def test_build_failure_reports_the_log(tmp_path, monkeypatch, script, expect):
    monkeypatch.setattr(build, "build_command", lambda sdist, wheel_dir: [sys.executable, "-c", script])
    sdist = tmp_path / "s.tar.gz"
    sdist.write_bytes(b"")
    with pytest.raises(RigllmError, match=expect) as err:
        build.build_wheel(sdist, tmp_path / "w", tmp_path / "build.log", timeout_s=2)
    assert "CMAKE_ARGS=" in (tmp_path / "build.log").read_text()
    if expect == "rc=3":
        assert "boom" in str(err.value)


@pytest.mark.parametrize("lib, ok", [("libggml-cuda.so", True), ("libggml-cpu.so", False)])
def test_build_checks_the_wheel_has_cuda(tmp_path, monkeypatch, lib, ok):
    script = ("import sys, zipfile; z = zipfile.ZipFile(sys.argv[1] + '/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl', 'w'); "
              f"z.writestr('llama_cpp/lib/{lib}', b'x'); z.close()")
    monkeypatch.setattr(build, "build_command", lambda sdist, wheel_dir: [sys.executable, "-c", script, str(wheel_dir)])
    sdist = tmp_path / "s.tar.gz"
    sdist.write_bytes(b"")
    if ok:
        assert build.build_wheel(sdist, tmp_path / "w", tmp_path / "log", 30).parent == tmp_path / "w"
    else:
        with pytest.raises(RigllmError, match="no libggml-cuda"):
            build.build_wheel(sdist, tmp_path / "w", tmp_path / "log", 30)


def test_build_flags_stay_small():
    args = build.CMAKE_ARGS.split()
    assert "-DGGML_CUDA=on" in args and "-DCMAKE_CUDA_ARCHITECTURES=90-real" in args
    assert "-DGGML_NATIVE=OFF" in args and "-DLLAVA_BUILD=OFF" in args and "-DGGML_CUDA_FA_ALL_QUANTS=OFF" in args


def test_obtain_wheel_needs_a_wheel_or_an_sdist(tmp_path):
    args = run.parser().parse_args(["--out", str(tmp_path / "out"), "--wheel", str(tmp_path)])
    with pytest.raises(RigllmError, match="no llama_cpp_python wheel"):
        run.obtain_wheel(args, [])
    args = run.parser().parse_args(["--out", str(tmp_path / "out")])
    with pytest.raises(RigllmError, match="--sdist"):
        run.obtain_wheel(args, [])
    found = tmp_path / "out" / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    found.parent.mkdir()
    found.write_bytes(b"w")
    assert run.obtain_wheel(args, []) == found  # a wheel already in --out is reused, not rebuilt


def test_matmul_ops_match_the_anchor_estimate():
    cfg = shape_config("9b")
    with_head = matmul_ops_per_token(cfg) + 2 * cfg.vocab_size * cfg.d_model
    assert with_head == pytest.approx(15.9e9, rel=0.01)  # anchor-qengine.md §6: ~15.9 GFLOP per token
    assert matmul_ops_per_token(shape_config("27b")) > 3 * matmul_ops_per_token(cfg)


def test_decode_projection_scales_the_fraction_to_the_cmp():
    r = decode_projection(tps=300.0, bytes_per_token=8_000_000_000, read_gbps=4000.0)
    assert r["gb_per_s"] == pytest.approx(2400.0)
    assert r["fraction_of_read_ceiling"] == pytest.approx(0.6)
    assert r["projected_cmp_tokens_per_s"] == pytest.approx(0.6 * CMP_READ_GBPS / 8.0)


def test_prefill_projection():
    r = prefill_projection(tps=5000.0, ops_per_token=10**10, peak_tops=100.0)
    assert r["fraction_of_peak"] == pytest.approx(0.5)
    assert r["projected_cmp_tokens_per_s"] == pytest.approx(0.5 * CMP_DP4A_TOPS * 1e12 / 1e10)
    assert prefill_projection(5000.0, 10**10, None) == {"fraction_of_peak": None, "projected_cmp_tokens_per_s": None}


def _ours(prefill: dict[int, float], decode: dict[int, float]) -> dict:
    return {"ceilings": {"copy_gb_per_s": 4200.0, "dp4a_tops": 130.0, "read_gb_per_s": 4400.0},
            "prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}


def _llama(prefill: dict[int, float], decode: dict[int, float]) -> dict:
    return {"prefill_tokens_per_s": prefill, "decode_tokens_per_s": decode}


def test_compare_shape_ratios_fractions_and_projections():
    cfg = shape_config("9b")
    ours = _ours({512: 5000.0, 2048: 4800.0}, {512: 320.0})
    llama = {"default": _llama({512: 8800.0, 2048: 9400.0}, {512: 215.0}),
             "no-graphs": _llama({512: 8700.0}, {512: 190.0})}
    t = compare_shape("9b", cfg, ours, llama)
    ops = matmul_ops_per_token(cfg)
    p = t["prefill"][512]
    assert p["ratio"] == {"default": pytest.approx(5000 / 8800), "no-graphs": pytest.approx(5000 / 8700)}
    assert p["rigllm"]["fraction_of_peak"] == pytest.approx(5000 * ops / 130e12)
    assert p["llama"]["default"] == {"tokens_per_s": 8800.0}  # no ceiling for its int8 tensor-core prefill
    assert t["prefill"][2048]["ratio"] == {"default": pytest.approx(4800 / 9400)}  # no-graphs has no 2048
    d = t["decode"][512]
    assert d["bytes_per_token"] == decode_bytes(cfg, 512)
    assert d["ratio"]["default"] == pytest.approx(320 / 215)
    assert d["llama"]["default"]["fraction_of_read_ceiling"] == pytest.approx(215 * decode_bytes(cfg, 512) / 4400e9)
    assert t["llama_cmp_published"] == LLAMA_CMP_PUBLISHED["9b"]


def test_compare_shape_llama_only_uses_the_given_read_ceiling():
    t = compare_shape("27b", shape_config("27b"), None, {"default": _llama({512: 2500.0}, {512: 75.0})},
                      read_gbps=4400.0)
    assert "rigllm" not in t["prefill"][512] and t["prefill"][512]["ratio"] == {}
    assert t["decode"][512]["llama"]["default"]["fraction_of_read_ceiling"] > 0


def test_markdown_table_rows_and_missing_cells():
    cfg = shape_config("9b")
    t = compare_shape("9b", cfg, _ours({512: 5000.0, 18432: 3800.0}, {512: 320.0, 18432: 300.0}),
                      {"default": _llama({512: 8800.0}, {512: 215.0, 18432: 206.0})})
    md = markdown_table(t, ["default"]).splitlines()
    assert md[0].startswith("**9b shape, Q8_0**")
    header = md[2]
    assert "llama.cpp default t/s" in header and "ratio vs default" in header
    rows = md[4:8]
    assert [r.split(" | ")[0] for r in rows] == ["| prefill 512", "| prefill 18K", "| decode at depth 512",
                                                "| decode at depth 18K"]
    assert rows[0].split(" | ")[3] == "0.57×"
    assert rows[1].split(" | ")[2] == "—"  # llama.cpp has no 18K prefill here
    assert all(r.count("|") == header.count("|") for r in rows)
    assert md[9] == ("llama.cpp measured on CMP 100-210 cards (published, not by us): prefill 297 tokens 199 t/s, "
                     "1160 tokens 316 t/s, 4620 tokens 361 t/s, 18400 tokens 324 t/s; tg64 46.6 t/s.")


def test_ensure_model_writes_once_under_a_temporary_name(tmp_path, monkeypatch):
    from engine.bench_peer import models

    calls = []

    def fake_write(path, cfg, weight_type, seed, name):
        calls.append((Path(path).name, cfg.d_model, weight_type))
        Path(path).write_bytes(b"gguf")

    monkeypatch.setattr(models, "write_random_model", fake_write)
    first = models.ensure_model(tmp_path / "m", "9b")
    again = models.ensure_model(tmp_path / "m", "9b")
    assert first == again == tmp_path / "m" / "rigllm-synthetic-9b-q8_0.gguf" and first.read_bytes() == b"gguf"
    assert calls == [("rigllm-synthetic-9b-q8_0.partial", 4096, "q8_0")]
    assert not list((tmp_path / "m").glob("*.partial"))


def test_main_runs_both_engines_per_shape_and_writes_json_and_markdown(tmp_path, monkeypatch):
    """The orchestration with the measurements replaced (they need the GPU): variants become child runs
    with their environment, JSON keys come back as ints, and both output files are written."""
    import json

    from engine.bench_peer import ours as ours_module

    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    seen = []

    def fake_llama(site, model, name, env, args, scratch):
        seen.append((model.name, name, env))
        return {"prefill_tokens_per_s": {"512": 8800.0}, "decode_tokens_per_s": {"512": 215.0}, "environment": env}

    def fake_ours(model, shape, prompts, depths, steps, reps):
        return shape_config(shape), _ours({n: 5000.0 for n in prompts}, {d: 320.0 for d in depths})

    monkeypatch.setattr(run, "obtain_wheel", lambda args, shapes: wheel)
    monkeypatch.setattr(build, "install_wheel", lambda w, target: target)
    monkeypatch.setattr(run, "run_llama", fake_llama)
    monkeypatch.setattr(run, "ensure_model", lambda folder, shape, weights: tmp_path / f"{shape}-{weights}.gguf")
    monkeypatch.setattr(run, "gpu_state", lambda: [{"name": "test GPU"}])
    monkeypatch.setattr(ours_module, "measure_ours", fake_ours)
    out = tmp_path / "out"
    assert run.main(["--out", str(out), "--shapes", "9b,27b", "--prompts", "512", "--depths", "512",
                     "--llama-variant", "default", "--llama-variant", "no-graphs:GGML_CUDA_DISABLE_GRAPHS=1"]) == 0
    assert seen == [("9b-q8_0.gguf", "default", {}), ("9b-q8_0.gguf", "no-graphs", {"GGML_CUDA_DISABLE_GRAPHS": "1"}),
                    ("27b-q8_0.gguf", "default", {}), ("27b-q8_0.gguf", "no-graphs", {"GGML_CUDA_DISABLE_GRAPHS": "1"})]
    result = json.loads((out / "peer-bench.json").read_text())
    assert result["wheel"] == wheel.name and result["gpus_after"] == [{"name": "test GPU"}]
    ratio = result["shapes"]["27b"]["comparison"]["prefill"]["512"]["ratio"]
    assert ratio == {"default": pytest.approx(5000 / 8800), "no-graphs": pytest.approx(5000 / 8800)}
    md = (out / "peer-bench.md").read_text()
    assert "**9b shape, Q8_0**" in md and "**27b shape, Q8_0**" in md and "ratio vs no-graphs" in md


def test_slim_wheel_keeps_one_copy_per_soname_and_the_python_package(tmp_path):
    import zipfile

    libs = [f"{d}/{n}" for d in ("lib", "llama_cpp/lib") for n in (
        "libllama.so", "libllama.so.0", "libllama.so.0.5.0", "libggml.so", "libggml.so.0", "libggml.so.0.25.3",
        "libggml-cuda.so", "libggml-cuda.so.0", "libggml-cuda.so.0.25.3")]
    other = ["llama_cpp/__init__.py", "llama_cpp/llama_cpp.py", "include/llama.h", "bin/x",
             "llama_cpp_python-0.3.36.dist-info/METADATA", "llama_cpp_python-0.3.36.dist-info/RECORD"]
    wheel = tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in libs + other[:-1]:
            z.writestr(name, name)
        z.writestr(other[-1], "\n".join(f"{n},sha256=x,1" for n in libs + other) + "\n")
    build.slim_wheel(wheel)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = {line.split(",")[0] for line in z.read(other[-1]).decode().splitlines()}
        assert z.read("llama_cpp/lib/libggml-cuda.so.0") == b"llama_cpp/lib/libggml-cuda.so.0"
    assert names == {"llama_cpp/lib/libllama.so", "llama_cpp/lib/libllama.so.0", "llama_cpp/lib/libggml.so",
                     "llama_cpp/lib/libggml.so.0", "llama_cpp/lib/libggml-cuda.so.0", *other[:2], *other[4:]}
    assert record == names


def test_obtain_wheel_builds_while_writing_models_and_returns_pieces(tmp_path, monkeypatch):
    built = tmp_path / "work" / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    written = []

    def fake_build(sdist, wheel_dir, log, timeout):
        built.parent.mkdir()
        built.write_bytes(b"w" * 100)
        return built

    monkeypatch.setattr(build, "build_wheel", fake_build)
    monkeypatch.setattr(run, "ensure_model", lambda folder, shape, weights: written.append((shape, weights)))
    args = run.parser().parse_args(["--out", str(tmp_path / "out"), "--sdist", str(tmp_path / "s.tar.gz"),
                                    "--shapes", "9b,27b", "--weights", "q8_0,q4_k_m", "--build-only"])
    assert run.obtain_wheel(args, ["9b", "27b"]) == built
    assert written == [("9b", "q8_0"), ("9b", "q4_k_m"), ("27b", "q8_0"), ("27b", "q4_k_m")]
    assert (tmp_path / "out" / f"{built.name}.part00").read_bytes() == b"w" * 100


def test_k_quant_files_are_compared_on_the_bytes_rigllm_counted_in_them(tmp_path, monkeypatch):
    """A K-quant run: each shape written in each --weights type, kept under its own key; decode fractions
    use the bytes rigllm counted on that file (fewer than the Q8_0 count of the shape), and qengine's
    Q8_0 llama.cpp figures are not printed under a K-quant table."""
    import json

    from engine.bench_peer import ours as ours_module

    q4_bytes = decode_bytes(shape_config("9b"), 512) * 6 // 10

    def fake_ours(model, shape, prompts, depths, steps, reps):
        measured = _ours({n: 5000.0 for n in prompts}, {d: 320.0 for d in depths})
        if "q4_k_m" in model.name:
            measured["decode_bytes_per_token"] = {d: q4_bytes for d in depths}
        return shape_config(shape), measured

    monkeypatch.setattr(run, "obtain_wheel", lambda args, shapes: tmp_path / "llama_cpp_python-0.3.36-py3-none-any.whl")
    monkeypatch.setattr(build, "install_wheel", lambda w, target: target)
    monkeypatch.setattr(run, "run_llama", lambda *a: {"prefill_tokens_per_s": {"512": 8800.0},
                                                      "decode_tokens_per_s": {"512": 215.0}})
    monkeypatch.setattr(run, "ensure_model", lambda folder, shape, weights: tmp_path / f"{shape}-{weights}.gguf")
    monkeypatch.setattr(run, "gpu_state", lambda: [])
    monkeypatch.setattr(ours_module, "measure_ours", fake_ours)
    out = tmp_path / "out"
    assert run.main(["--out", str(out), "--shapes", "9b", "--weights", "q8_0,q4_k_m", "--prompts", "512",
                     "--depths", "512"]) == 0
    shapes = json.loads((out / "peer-bench.json").read_text())["shapes"]
    assert list(shapes) == ["9b", "9b-q4_k_m"] and shapes["9b-q4_k_m"]["weights"] == "q4_k_m"
    q8 = shapes["9b"]["comparison"]["decode"]["512"]
    q4 = shapes["9b-q4_k_m"]["comparison"]["decode"]["512"]
    assert q4["bytes_per_token"] == q4_bytes < q8["bytes_per_token"]
    assert q4["rigllm"]["fraction_of_read_ceiling"] == pytest.approx(q8["rigllm"]["fraction_of_read_ceiling"] * 0.6, rel=1e-3)
    assert shapes["9b-q4_k_m"]["comparison"]["llama_cmp_published"] is None
    md = (out / "peer-bench.md").read_text()
    assert "**9b shape, Q4_K_M**" in md and md.count("published, not by us") == 1
    saved, text = rerender(json.loads((out / "peer-bench.json").read_text()))  # the method re-applied from JSON
    assert saved["shapes"]["9b-q4_k_m"]["comparison"]["decode"][512]["bytes_per_token"] == q4_bytes
    assert "**9b shape, Q4_K_M**" in text


def test_weights_outside_the_synthetic_types_are_refused(capsys):
    with pytest.raises(SystemExit):
        run.parser().parse_args(["--weights", "q8_0,iq4_xs"])
    assert "expected file types among q8_0, q4_k_m, q5_k_m, q6_k" in capsys.readouterr().err
    with pytest.raises(ValueError, match="needs rigllm's measurements"):
        compare_shape("9b", shape_config("9b"), None, {}, read_gbps=4400.0, weights="q4_k_m")
