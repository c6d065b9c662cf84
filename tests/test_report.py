"""report.html: the data it embeds, and the page itself driven in a real headless Chromium.

The browser tests use the system's Chromium (Debian's `chromium`, or the binary named by
$GRAPHSPLIT_CHROMIUM) through playwright, and skip only where no such binary exists.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphsplit import Plan, transform
from graphsplit.cli import main as cli_main
from graphsplit.loader import load_model
from graphsplit.report.artifacts import plan_record, stage_source
from graphsplit.report.html import render_report

from .conftest import EXAMPLES
from .test_cli import cli

DATA = re.compile(r'<script type="application/json" id="graphsplit-data">(.*?)</script>', re.S)


def page_data(html: str) -> dict:
    return json.loads(DATA.search(html).group(1))


def ops(data: dict, stage: int | None = None) -> list[dict]:
    stages = data["stages"] if stage is None else [data["stages"][stage]]
    return [n for st in stages for n in st["nodes"] if n["role"] == "op"]


def by_module(data: dict, module: str, op: str = "linear") -> dict:
    return next(n for n in ops(data) if n["mod"] == module and n["op"] == op)


@pytest.fixture(scope="module")
def llama_tp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama, tp=2 pp=2, checkpointed blocks, bf16 autocast: every mark the page draws."""
    out = tmp_path_factory.mktemp("report") / "llama"
    transform(str(EXAMPLES / "llama.py"), Plan(tp=2, pp=2, checkpoint="blocks", autocast="bf16"), out)
    return out


@pytest.fixture(scope="module")
def gpt_pp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "gpt"
    transform(str(EXAMPLES / "gpt.py"), Plan(pp=4), out)
    return out


# --- the embedded data ---------------------------------------------------------------


def test_report_is_written_and_self_contained(llama_tp):
    html = (llama_tp / "report.html").read_text()
    # nothing fetched: no external scripts, styles, fonts or images
    assert not re.search(r"<script[^>]+src=|<link |@import|url\(|<img ", html)
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    data = page_data(html)
    assert [st["index"] for st in data["stages"]] == [0, 1]
    assert data["record"]["plan"]["tp"] == 2
    assert "class Stage0" in data["stages"][0]["code"]
    assert data["stages"][0]["code"] == (llama_tp / "stage_0.py").read_text()


def test_styles_shardings_and_collectives(llama_tp):
    data = page_data((llama_tp / "report.html").read_text())
    wq = by_module(data, "layers.0.attention.wq")
    assert wq["style"] == "column" and wq["sh"] == "S(2)"
    assert wq["shape"] == [4, 32, 32] and wq["dtype"] == "bfloat16"  # one tp rank's 64 // 2 columns
    assert wq["w"] == [["layers.0.attention.wq.weight", "float32[32, 64]", "S(0)"]]
    wo = by_module(data, "layers.0.attention.wo")
    assert wo["style"] == "row" and wo["sh"] == "P"
    vocab = next(n for n in ops(data) if n["op"] == "vocab_parallel_embedding")
    assert vocab["style"] == "vocab" and vocab["coll"] == ["all-reduce fwd"]
    # Megatron's plan: 2 all-reduces forward and 2 backward per block, each its own node
    block = [n for n in ops(data) if n["g"] == "layers.0" and "coll" in n]
    assert sorted(c for n in block for c in n["coll"]) == ["all-reduce bwd"] * 2 + ["all-reduce fwd"] * 2
    assert {n["op"] for n in block} == {"copy_to_tp", "reduce_from_tp"}


def test_checkpoint_and_autocast_marks(llama_tp):
    data = page_data((llama_tp / "report.html").read_text())
    assert data["autocast"] == "bf16"
    block = [n for n in ops(data) if n["g"] == "layers.1"]
    assert block and all(n.get("ck", "").startswith("ckpt_") for n in block)
    assert all(n.get("low") for n in block if n["op"] == "linear")
    # norms stay fp32 under autocast: not marked
    assert not any(n.get("low") for n in block if n["op"] == "rsqrt")


def test_scalars_parameters_and_plumbing_are_not_drawn(llama_tp):
    data = page_data((llama_tp / "report.html").read_text())
    names = {n["op"] for n in ops(data)}
    assert not names & {"size", "getattr", "dense_grad"}
    # autocast's weight casts belong to the linear that reads them
    assert not any(n["op"] == "to" and n.get("dtype") == "bfloat16" and len(n["shape"]) == 2 for n in ops(data))
    inputs = [n["id"] for n in data["stages"][1]["nodes"] if n["role"] == "input"]
    assert inputs == data["record"]["stages"][1]["inputs"]
    # every edge points at an earlier drawn node of the same stage
    for st in data["stages"]:
        for i, n in enumerate(st["nodes"]):
            assert all(0 <= j < i for j in n["in"]), n


def test_source_lines_point_into_the_model(llama_tp):
    data = page_data((llama_tp / "report.html").read_text())
    wq = by_module(data, "layers.0.attention.wq")
    name, path, line, function, code = data["sources"][wq["src"]]
    assert (name, function) == ("llama.py", "forward") and path.endswith("examples/llama.py")
    assert "self.wq(x)" in code and line > 0
    from_model = [n for n in ops(data) if not n.get("ins")]
    # f and g are graphsplit's; the vocab-parallel lookup is the model's embedding, rewritten
    assert {n["op"] for n in from_model if "coll" in n} == {"vocab_parallel_embedding"}
    assert sum("src" in n for n in from_model) > 0.95 * len(from_model)
    assert all(data["sources"][n["src"]][0] == "llama.py" for n in ops(data) if "src" in n)
    # an inserted node points at the line of the op it serves: f before the q/k/v projections
    f = next(n for n in ops(data) if n["op"] == "copy_to_tp" and n["g"] == "layers.0")
    assert f["ins"] and "self.wq(x)" in data["sources"][f["src"]][4]


def test_source_from_an_export_stack_trace():
    from graphsplit.ir.user_source import source_from_stack_trace as _source_from_stack_trace

    functional = Path(torch.__file__).parent / "nn" / "functional.py"
    text = (f'File "/work/model.py", line 12, in forward\n    return self.block(x)\n'
            f'  File "/work/model.py", line 5, in forward\n    y = F.gelu(x)\n'
            f'  File "{functional}", line 99, in gelu\n    return torch._C._nn.gelu(x)')
    found = _source_from_stack_trace(text)
    assert (found.file, found.line, found.function) == ("/work/model.py", 5, "forward")
    assert str(found) == "model.py:5 in forward"
    assert _source_from_stack_trace(None) is None


def test_graph_dot_and_report_share_one_view(llama_tp):
    """graph.dot's boxes are the report's groups, with the same styles (under autocast too)."""
    dot = (llama_tp / "graph.dot").read_text()
    data = page_data((llama_tp / "report.html").read_text())
    for st in data["stages"]:
        cluster = dot.split(f"subgraph cluster_stage{st['index']}")[1].split("}")[0]
        boxes = re.findall(r'label="([^"\\]+)', cluster)
        assert boxes[1:] == list(dict.fromkeys(n["g"] or "<root>" for n in ops(data, st["index"])))
    assert 'label="layers.0\\n5 column, 2 row\\n2 all-reduce bwd, 2 all-reduce fwd\\n[checkpointed, bf16]"' in dot


def test_data_cannot_close_its_script_element(llama_tp):
    loaded = load_model(str(EXAMPLES / "mlp.py"))
    program = transform(loaded, Plan(pp=2)).program
    record = plan_record(program, loaded, llama_tp, {"stages": []})
    record["model"]["factory"] = "</script><script>alert(1)</script><!--"
    html = render_report(program, record, {0: "x = '</script>'"})
    assert "<script>alert" not in html and html.count("</script>") == 2
    data = page_data(html)
    assert data["record"]["model"]["factory"] == "</script><script>alert(1)</script><!--"
    assert data["stages"][0]["code"] == "x = '</script>'"


def test_80_layer_report_builds_fast_and_stays_small(llama_80):
    out, program, record, code = llama_80
    start = time.perf_counter()
    html = render_report(program, record, code)
    seconds = time.perf_counter() - start
    assert seconds < 3.0, seconds
    assert len(html) < 8e6, len(html)
    data = page_data(html)
    groups = {n["g"] for n in ops(data)}
    assert {f"layers.{i}" for i in range(80)} <= groups


# --- inspect --open ------------------------------------------------------------------


def test_inspect_open_opens_the_report(gpt_pp4, monkeypatch):
    opened = []
    monkeypatch.setattr("webbrowser.open", lambda uri, *a, **k: opened.append(uri) or True)
    r = CliRunner().invoke(cli_main, ["inspect", str(gpt_pp4), "--open"])
    assert r.exit_code == 0, r.output
    assert opened == [(gpt_pp4 / "report.html").resolve().as_uri()]
    assert "balance" in r.output


def test_inspect_open_without_a_report_fails_in_one_line(gpt_pp4, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(gpt_pp4, old)
    (old / "report.html").unlink()
    r = cli("inspect", old, "--open")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "has no report.html" in lines[0], r.stderr


# --- the page in a real browser --------------------------------------------------------


def _load_pictures():
    """docs/pictures.py, which makes README's picture (and finds Chromium as these tests do)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pictures", EXAMPLES.parent / "docs" / "pictures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pictures = _load_pictures()


@pytest.fixture(scope="module")
def browser():
    binary = pictures.chromium()
    if binary is None:
        pytest.skip("no Chromium binary (install Debian's chromium, or set GRAPHSPLIT_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=binary)
        yield b
        b.close()


class Page:
    """A report opened in a fresh tab, recording console errors, page errors and any network request."""

    def __init__(self, browser, path: Path) -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route(re.compile(r"^(?!file:|data:|about:)"),
                        lambda route: (self.requests.append(route.request.url), route.abort()))
        start = time.perf_counter()
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function("window.graphsplitReady !== undefined")
        self.load_seconds = time.perf_counter() - start

    def count(self, selector: str) -> int:
        return self.page.locator(selector).count()

    def close(self) -> None:
        self.page.close()
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests


def test_page_overview_graph_inspect_code_plan(browser, llama_tp):
    data = page_data((llama_tp / "report.html").read_text())
    page = Page(browser, llama_tp / "report.html")
    p = page.page
    # overview: a box per stage, the tensors crossing the boundary with shape and bytes
    assert page.count(".stage-card") == 2
    boundary = p.locator('.boundary[data-boundary="0"]').inner_text()
    assert "KiB / micro-batch" in boundary and "float32[4, 32, 64]" in boundary
    assert "memory on each of its 2 tp ranks" in p.locator('.stage-card[data-stage="0"]').inner_text()

    p.click('#tabs button[data-tab="graph"]')
    assert [p.locator(".cluster").nth(i).get_attribute("data-stage") for i in range(page.count(".cluster"))] == ["0", "1"]
    # blocks start collapsed, coloured by style and marked checkpointed / bf16
    block = p.locator('.cluster[data-stage="0"] .group[data-block="layers.0"]')
    assert "collapsed" in block.get_attribute("class") and "ckpt" in block.get_attribute("class")
    assert "style-column" in block.get_attribute("class") and "bf16" in block.inner_text()
    assert page.count('.cluster[data-stage="0"] .node.style-vocab.collective') == 1
    wq = by_module(data, "layers.0.attention.wq")
    assert page.count(f'[data-node="{wq["id"]}"]') == 0

    block.click()
    assert "expanded" in p.locator('.cluster[data-stage="0"] .group[data-block="layers.0"]').get_attribute("class")
    stage0 = p.locator('.cluster[data-stage="0"]')
    assert stage0.locator(".node.style-column").count() == 5 and stage0.locator(".node.style-row").count() == 2
    assert stage0.locator(".node.collective").count() == 1 + 4
    assert stage0.locator(".node.ckpt").count() >= 40

    node = stage0.locator(f'[data-node="{wq["id"]}"]')
    assert "style-column" in node.get_attribute("class")
    hover = node.get_attribute("title")
    assert "sharding S(2)" in hover and "bfloat16[4, 32, 32]" in hover and "llama.py:74" in hover
    node.click()
    panel = p.locator("#inspect").inner_text()
    for text in ("layers.0.attention.wq", "S(2)", "column", "[4, 32, 32]", "bfloat16",
                 "layers.0.attention.wq.weight float32[32, 64] S(0)", "llama.py:74 in forward", "self.wq(x)"):
        assert text in panel, (text, panel)

    p.click('#tabs button[data-tab="code"]')
    assert "class Stage0" in p.locator("#stage-code").inner_text()
    p.click('.stage-buttons button[data-stage="1"]')
    assert "class Stage1" in p.locator("#stage-code").inner_text()
    p.click('#tabs button[data-tab="plan"]')
    assert "layers.0.attention.wq.weight" in p.locator("#plan-tab").inner_text()
    page.close()


def test_page_one_cluster_per_stage_pp4(browser, gpt_pp4):
    page = Page(browser, gpt_pp4 / "report.html")
    page.page.click('#tabs button[data-tab="graph"]')
    assert page.count(".cluster") == 4 and page.count(".stage-card") == 4
    assert page.count(".boundary") == 3
    page.close()


def test_page_80_layers_loads_in_seconds_collapsed(browser, llama_80):
    out = llama_80[0]
    page = Page(browser, out / "report.html")
    assert page.load_seconds < 5.0, page.load_seconds
    p = page.page
    p.click('#tabs button[data-tab="graph"]')
    assert page.count(".cluster") == 8
    assert page.count(".group.collapsed") >= 80
    assert page.count("[data-node]") < 120  # blocks collapsed: a few loose nodes per stage
    p.fill("#find", "layers.41.attention.wo")
    p.press("#find", "Enter")
    panel = p.locator("#inspect").inner_text()
    assert "layers.41.attention.wo" in panel and "row" in panel and "S(1)" in panel
    page.close()


@pytest.fixture(scope="module")
def llama_80(tmp_path_factory: pytest.TempPathFactory):
    """The 80-layer, Llama-2-70B-shaped model of bench/transform_time.py on meta, tp=2 pp=8."""
    loaded = load_model(str(EXAMPLES / "llama.py"))
    config = dict(dim=8192, n_heads=64, n_kv_heads=8, hidden=28672, vocab_size=32000, max_seq_len=4096, n_layers=80)
    with torch.device("meta"):
        model = loaded.builder(**config)
    ids = torch.randint(0, config["vocab_size"], (8, 1024), device="meta")
    ready = dataclasses.replace(loaded, builder=lambda: model, args=(ids,), kwargs={}, target=torch.zeros_like(ids))
    out = tmp_path_factory.mktemp("report") / "llama80"
    result = transform(ready, Plan(tp=2, pp=8), out)
    code = {st.index: stage_source(st, result.program) for st in result.program.stages}
    return out, result.program, plan_record(result.program, ready, out, result.summary), code


# --- training curves (inspect on a run's --metrics file) ------------------------------

POLYLINE = re.compile(r'<polyline data-series="([^"]+)" points="([^"]*)"')


def _curves(html: str) -> dict[str, list[tuple[float, float]]]:
    return {name: [tuple(map(float, p.split(","))) for p in points.split()] for name, points in POLYLINE.findall(html)}


def _write_metrics(path: Path, losses: list[float], evals: dict[int, float] | None = None, start: int = 1) -> list[dict]:
    rows = []
    for step, loss in enumerate(losses, start):
        row = {"step": step, "loss": loss, "lr": 0.01 / step, "grad_norm": 1.0 + step, "clipped": step == 2,
               "step_seconds": 0.1, "tokens_per_second": 640.0, "max_memory_bytes": 2**26, "memory": "cpu_peak_rss"}
        if evals and step in evals:
            row["eval_loss"] = evals[step]
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_inspect_a_metrics_file_prints_the_steps_and_plots_the_curves(tmp_path):
    from graphsplit.report.curves import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH

    metrics = tmp_path / "out" / "m.jsonl"
    losses = [2.5, 2.0, 2.25, 1.5, 1.75, 1.25]
    _write_metrics(metrics, losses, evals={3: 2.4, 6: 1.9})
    with metrics.open("a") as f:  # a run resumed from step 5 trained step 6 again: its latest line counts
        f.write(json.dumps({"step": 6, "loss": 1.0, "eval_loss": 1.8}) + "\n")
    losses[-1] = 1.0
    r = CliRunner().invoke(cli_main, ["inspect", str(metrics)])
    assert r.exit_code == 0, r.output
    assert "6 steps" in r.stdout and "2.500000" in r.stdout and "1.000000" in r.stdout and "3*" in r.stdout
    html = (tmp_path / "out" / "report.html").read_text()
    assert "<script" not in html and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    curves = _curves(html)
    assert set(curves) == {"loss", "eval loss", "lr", "grad_norm", "tokens_per_second"}
    loss = curves["loss"]
    assert len(loss) == len(losses)  # one point per step
    assert [x for x, _ in loss] == sorted(x for x, _ in loss) and loss[0][0] == LEFT and loss[-1][0] == WIDTH - RIGHT
    # y follows the losses: the highest at the top of the plot, the lowest at its bottom, linear between
    ys = [y for _, y in loss]
    assert ys[losses.index(max(losses))] == pytest.approx(TOP) and ys[losses.index(min(losses))] == pytest.approx(HEIGHT - BOTTOM)
    for (_, y), value in zip(loss, losses):
        assert y == pytest.approx(TOP + (HEIGHT - TOP - BOTTOM) * (2.5 - value) / (2.5 - 1.0), abs=0.01)
    assert len(curves["eval loss"]) == 2 and "6 steps (1 to 6)" in html and "lowest 1 at step 6" in html

    # again on the folder: the section is replaced, not added to
    _write_metrics(tmp_path / "out" / "metrics.jsonl", [3.0, 2.0, 1.0])
    assert CliRunner().invoke(cli_main, ["inspect", str(tmp_path / "out")]).exit_code == 0
    html = (tmp_path / "out" / "report.html").read_text()
    assert html.count("<h2>Training</h2>") == 1 and len(_curves(html)["loss"]) == 3
    as_json = CliRunner().invoke(cli_main, ["inspect", str(tmp_path / "out"), "--json"])
    assert [row["step"] for row in json.loads(as_json.stdout)] == [1, 2, 3]


def test_a_long_run_prints_evenly_spaced_steps_and_plots_them_all(tmp_path):
    _write_metrics(tmp_path / "metrics.jsonl", [1.0 / s for s in range(1, 1001)])
    r = CliRunner().invoke(cli_main, ["inspect", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert "1000 steps (showing 25)" in r.stdout and re.search(r"\b1000\b", r.stdout)
    assert len(_curves((tmp_path / "report.html").read_text())["loss"]) == 1000


@pytest.fixture(scope="module")
def gpt_trained(gpt_pp4, tmp_path_factory) -> Path:
    """A transform folder that also holds the metrics of a run, inspected."""
    out = tmp_path_factory.mktemp("trained") / "gpt"
    shutil.copytree(gpt_pp4, out)
    _write_metrics(out / "metrics.jsonl", [4.0, 3.5, 3.0], evals={3: 3.25})
    r = CliRunner().invoke(cli_main, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    assert "balance" in r.stdout and "3 steps" in r.stdout  # the summary, then the training table
    return out


def test_a_transform_report_gains_a_training_section(gpt_trained, gpt_pp4):
    html = (gpt_trained / "report.html").read_text()
    assert page_data(html) == page_data((gpt_pp4 / "report.html").read_text())  # the rest unchanged
    assert len(_curves(html)["loss"]) == 3 and html.count("<h2>Training</h2>") == 1
    assert "<h2>Training</h2>" not in (gpt_pp4 / "report.html").read_text()


METRICS_ROWS = [
    ("missing", None, r"m\.jsonl does not exist; write it with graphsplit run MODEL --metrics"),
    ("garbled", b'{"step": 1, "loss": 2.0}\n{"step": 2, "lo', r"m\.jsonl line 2 is not JSON \(.*\); give the file"),
    ("not-a-line", b'[1, 2]\n', r"m\.jsonl line 1 is not a metrics line \(each holds an integer 'step' and a 'loss'\)"),
    ("no-loss", b'{"step": 1}\n', r"line 1 is not a metrics line"),
    ("binary", bytes(range(256)), r"m\.jsonl is not text \(byte 128 is not UTF-8\)"),
    ("empty", b"", r"m\.jsonl holds no steps"),
    ("a-foreign-report", b'{"step": 1, "loss": 2.0}\n', r"report\.html has no place for the training curves"),
]


@pytest.mark.parametrize("content, pattern", [r[1:] for r in METRICS_ROWS], ids=[r[0] for r in METRICS_ROWS])
def test_a_bad_metrics_file_is_one_line(tmp_path, content, pattern):
    metrics = tmp_path / "m.jsonl"
    if content is not None:
        metrics.write_bytes(content)
    if pattern.startswith("report"):
        (tmp_path / "report.html").write_text("<html>the user's own page</html>")
    r = CliRunner().invoke(cli_main, ["inspect", str(metrics)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and r.stdout == "", r.output
    assert re.search(pattern, lines[0]), lines[0]
    if pattern.startswith("report"):
        assert (tmp_path / "report.html").read_text() == "<html>the user's own page</html>"
    else:
        assert not (tmp_path / "report.html").exists()


def test_page_training_tab(browser, gpt_trained, gpt_pp4):
    page = Page(browser, gpt_pp4 / "report.html")  # no run's metrics: no Training tab
    assert not page.page.locator('#tabs button[data-tab="training"]').is_visible()
    page.close()
    page = Page(browser, gpt_trained / "report.html")
    p = page.page
    p.click('#tabs button[data-tab="training"]')
    assert p.locator("#training-tab svg.chart").count() == 4 and p.locator("#training-tab").is_visible()
    assert "3 steps (1 to 3)" in p.locator("#training-tab").inner_text()
    page.close()


def test_readme_picture_is_made_by_its_script(browser, llama_tp, tmp_path):
    # docs/pictures.py makes README's picture from the same transform as llama_tp; here it runs on
    # that report and must give a PNG of its viewport (the committed one is this script's output)
    import struct

    png = pictures.screenshot(browser, llama_tp / "report.html", tmp_path / "report.png")
    head = png.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (pictures.VIEWPORT["width"], pictures.VIEWPORT["height"])
    committed = pictures.PICTURE.read_bytes()[:24]
    assert struct.unpack(">II", committed[16:24]) == (pictures.VIEWPORT["width"], pictures.VIEWPORT["height"])


def test_page_shows_the_context_parallel_cut(browser, tmp_path):
    """Under --cp the overview lists which positions each cp rank holds and what each attention call
    gathers (the GPT example at cp 2: 4 causal calls, 64 KiB each)."""
    out = tmp_path / "gpt_cp"
    transform(str(EXAMPLES / "gpt.py"), Plan(dp=2, cp=2), out)
    page = Page(browser, out / "report.html")
    text = page.page.locator("body").inner_text()
    assert "Context parallel over 2 ranks: each 32-token sequence in 4 chunks" in text
    assert "0-7, 24-31" in text and "8-15, 16-23" in text
    assert text.count("h.0.attn") >= 1 and "64.0 KiB" in text
    page.close()
