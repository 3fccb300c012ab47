"""The chat page at / in a real headless Chromium, against a real server on the default model.

Chromium and its driver are Debian's (`.ci/run` installs them with apt-get as root; nothing is
downloaded at run time). Without them the test is skipped outside CI and fails in CI, so a CI
run never counts a skipped browser test as passing. `MLXCEL_WEBUI_SCREENSHOT=docs/webui.png`
saves the README's screenshot from the same session.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.error
import urllib.request

import pytest
from test_server import COPY_PROMPT, start_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
KEY = "page-test-key"

if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):
        raise RuntimeError(
            "the chat page test needs chromium and chromedriver (apt-get install chromium chromium-driver)"
        )
    pytest.skip("no chromium/chromedriver here (apt-get install chromium chromium-driver)", allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path_factory.mktemp("cfg")))
    proc, url, lines = start_server(env, "--draft-kind", "prompt-lookup", "--api-key", KEY)
    yield url, lines
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(DRIVER))
    yield driver
    driver.quit()


def _wait(driver, what, timeout=60):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: what(d))


def _replies(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")


def _set(driver, element_id, value):
    el = driver.find_element(By.ID, element_id)
    el.clear()
    el.send_keys(str(value))
    el.send_keys(Keys.TAB)  # fires change


def _send(driver, text):
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    driver.find_element(By.ID, "send").click()


def _idle(driver):
    return driver.find_element(By.ID, "send").is_displayed()


def test_the_page_streams_counts_stops_keeps_and_explains_keys(server, browser):
    url, _ = server
    d = browser
    # a client asking for JSON gets health at /; everyone else the page, as from llama-server
    with urllib.request.urlopen(urllib.request.Request(url + "/", headers={"Accept": "application/json"})) as r:
        assert json.loads(r.read())["status"] == "ok"
    with urllib.request.urlopen(urllib.request.Request(url + "/", headers={"Accept": "*/*"})) as r:
        assert r.headers["content-type"].startswith("text/html")
    d.get(url + "/")
    assert d.title == "mlxcel-py chat"

    # markdown: code fences and inline code become code, and nothing the model writes is markup
    html = d.execute_script(
        "return markdown(arguments[0])", "Use `x`:\n\n```python\nprint('<b>')\n```\n\n- **one**\n- two <script>"
    )
    assert '<pre><code class="lang-python">print(&#39;&lt;b&gt;&#39;)</code></pre>' in html
    assert "<code>x</code>" in html and "<li><strong>one</strong></li>" in html
    assert "<script>" not in html and "&lt;script&gt;" in html

    # a wrong key: a clear message naming the key field, from /props (401)
    _set(d, "api-key", "not-the-key")
    err = _wait(d, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed() else None)
    assert "API key" in err.text
    _set(d, "api-key", KEY)
    _wait(d, lambda d: not d.find_element(By.ID, "error").is_displayed())
    assert _wait(d, lambda d: "prompt-lookup" in d.find_element(By.ID, "drafter").text)
    assert not d.find_element(By.ID, "attach-label").is_displayed()  # a text model: no image picker
    d.find_element(By.TAG_NAME, "summary").click()
    _set(d, "temperature", 0)
    _set(d, "max-tokens", 80)
    d.find_element(By.TAG_NAME, "summary").click()  # close the settings again

    # streamed: the reply's text grows in many steps (recorded in the page as it changes)
    d.execute_script(
        "window.__lengths = [];"
        "new MutationObserver(() => { const r = document.querySelectorAll('.msg.assistant .content');"
        " if (r.length) window.__lengths.push(r[r.length - 1].textContent.length); })"
        ".observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});"
    )
    _send(d, COPY_PROMPT)
    _wait(d, lambda d: _idle(d) and _replies(d))
    lengths = [n for n in d.execute_script("return window.__lengths") if n > 0]
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), lengths
    reply = _replies(d)[-1]
    assert "apples" in reply.find_element(By.CLASS_NAME, "content").text
    stats = reply.find_element(By.CLASS_NAME, "stats").text
    assert "tok/s" in stats and "accepted" in stats and "prompt-lookup" in stats, stats

    # plain decoding on the next reply only: the server's drafter stays on for the one after
    d.find_element(By.ID, "plain-next").click()
    _send(d, COPY_PROMPT)
    _wait(d, lambda d: _idle(d) and len(_replies(d)) == 2 and "tok/s" in _replies(d)[-1].text)
    assert "plain decoding" in _replies(d)[-1].find_element(By.CLASS_NAME, "stats").text
    assert not d.find_element(By.ID, "plain-next").is_selected()
    if os.environ.get("MLXCEL_WEBUI_SCREENSHOT"):
        d.save_screenshot(os.environ["MLXCEL_WEBUI_SCREENSHOT"])

    # stop mid-reply: the text stops growing, the reply says so, the server keeps serving
    d.find_element(By.TAG_NAME, "summary").click()
    _set(d, "max-tokens", 600)
    d.find_element(By.TAG_NAME, "summary").click()
    _send(d, "Write a very long story about a dragon who learns to cook.")
    _wait(d, lambda d: len(_replies(d)) == 3 and len(_replies(d)[-1].find_element(By.CLASS_NAME, "content").text) > 40)
    d.find_element(By.ID, "stop").click()
    _wait(d, _idle)
    stopped = _replies(d)[-1]
    text = stopped.find_element(By.CLASS_NAME, "content").text
    time.sleep(1.0)
    assert stopped.find_element(By.CLASS_NAME, "content").text == text
    assert "stopped" in stopped.find_element(By.CLASS_NAME, "stats").text
    assert "pieces in" in stopped.find_element(By.CLASS_NAME, "stats").text
    with urllib.request.urlopen(url + "/health") as r:  # the hang-up freed its slot
        assert _wait(d, lambda _: json.loads(urllib.request.urlopen(url + "/health").read())["slots_processing"] == 0)

    # reload: the conversation, the key and the settings are still there
    d.refresh()
    _wait(d, lambda d: len(_replies(d)) == 3)
    users = [m.text for m in d.find_elements(By.CSS_SELECTOR, ".msg.user .content")]
    assert users[0] == COPY_PROMPT and users[2].startswith("Write a very long story")
    assert d.find_element(By.ID, "api-key").get_attribute("value") == KEY
    assert d.find_element(By.ID, "max-tokens").get_attribute("value") == "600"
    assert "stopped" in _replies(d)[-1].find_element(By.CLASS_NAME, "stats").text


def test_a_reply_streaming_through_a_reload_is_read_again_whole(server, browser):
    """The page sends each reply as a resumable stream: reloaded mid-reply, it reads the reply
    again from the server (which went on generating it), to the same text a direct request gets."""
    url, _ = server
    d = browser
    d.get(url + "/")
    _set(d, "api-key", KEY)
    d.find_element(By.ID, "new-chat").click()
    d.find_element(By.TAG_NAME, "summary").click()
    _set(d, "temperature", 0)
    _set(d, "max-tokens", 300)
    d.find_element(By.TAG_NAME, "summary").click()
    prompt = "Write a long story about a lighthouse keeper and a storm."
    _send(d, prompt)
    _wait(d, lambda d: _replies(d) and len(_replies(d)[-1].find_element(By.CLASS_NAME, "content").text) > 20)
    d.refresh()  # mid-reply
    _wait(d, lambda d: _replies(d) and _idle(d) and "tok/s" in _replies(d)[-1].text, 120)
    got = d.execute_script("const c = conversation(); return c.messages[c.messages.length - 1];")
    assert "stream" not in got and not got.get("stopped")
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 300}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        direct = json.loads(r.read())["choices"][0]["message"]["content"]
    assert got["content"] == direct and len(direct) > 100


def test_no_webui_is_a_404_at_the_root_and_health_for_json_clients(tmp_path):
    """llama-server's --no-webui, now --no-ui there (either spelling): no page at / for any client
    (#52; llama.cpp's test_no_ui reads it with Accept: */*); a client that asks for JSON still
    gets health there."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    from conftest import make_tiny_model

    model = make_tiny_model(tmp_path / "m")
    proc, url, _ = start_server(env, "-m", str(model), "--no-ui")
    try:
        for path, accept in (
            ("/", "text/html"),
            ("/", "*/*"),
            ("/bundle.js", "*/*"),
            ("/bundle.css", "*/*"),
            ("/sw.js", "*/*"),
            ("/_app/version.json", "*/*"),
        ):
            req = urllib.request.Request(url + path, headers={"Accept": accept})
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req)
            assert err.value.code == 404 and "--no-webui" in json.loads(err.value.read())["error"]["message"]
        with urllib.request.urlopen(urllib.request.Request(url + "/", headers={"Accept": "application/json"})) as r:
            assert r.headers["content-type"].startswith("application/json")
            assert json.loads(r.read())["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_page_attaches_an_image_when_the_model_takes_them(browser, tmp_path):
    """A vision model's server (a tiny random LLaVA): the page shows the image picker (/props'
    modalities), sends the picked file as an image_url part, shows it in the conversation, and the
    reply is the server's greedy reply to that image and text (the same as over plain HTTP)."""
    import base64

    import tiny_vlms
    from test_server import post
    from test_vision import picture

    folder = tiny_vlms.llava(tmp_path / "llava")
    img = tmp_path / "shot.png"
    picture(3).save(img)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = start_server(env, "-m", str(folder), "--draft-kind", "prompt-lookup")
    try:
        d = browser
        d.get(url + "/")  # another port: another origin, a fresh localStorage
        _wait(d, lambda d: d.find_element(By.ID, "attach-label").is_displayed())
        d.find_element(By.TAG_NAME, "summary").click()
        _set(d, "temperature", 0)
        _set(d, "max-tokens", 12)
        d.find_element(By.TAG_NAME, "summary").click()
        d.find_element(By.ID, "attach").send_keys(str(img))
        _wait(d, lambda d: d.find_element(By.ID, "attached").text == "1 image attached")
        _send(d, "describe the picture")
        _wait(d, lambda d: _idle(d) and _replies(d) and "tok/s" in _replies(d)[-1].text)
        assert d.find_elements(By.CSS_SELECTOR, ".msg.user img.thumb")
        assert d.find_element(By.ID, "attached").text == ""  # the next message goes without it
        shown = d.execute_script("return conversation().messages[1].content")
        url_ = "data:image/png;base64," + base64.b64encode(img.read_bytes()).decode()
        content = [{"type": "image_url", "image_url": {"url": url_}}, {"type": "text", "text": "describe the picture"}]
        status, r = post(
            url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0},
        )
        assert status == 200 and r["choices"][0]["message"]["content"] == shown
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_page_behind_a_router_picks_the_model_each_request_goes_to(browser, tmp_path):
    from conftest import make_tiny_model
    from test_router import _start, _status

    models = tmp_path / "models"
    for i, name in enumerate(("alpha", "beta")):
        make_tiny_model(models / name, seed=i + 1, scale=2.5)
    env = dict(os.environ, HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path / "cfg"))
    proc, url, _ = _start(models, env, "--temp", "0", "-n", "6")
    try:
        d = browser
        d.get(url + "/")
        pick = _wait(
            d,
            lambda d: (
                d.find_element(By.ID, "model-pick") if d.find_element(By.ID, "model-pick").is_displayed() else None
            ),
        )
        assert [o.text for o in pick.find_elements(By.TAG_NAME, "option")] == ["alpha", "beta"]
        assert "not loaded" in d.find_element(By.ID, "drafter").text
        pick.find_element(By.CSS_SELECTOR, "option[value=beta]").click()
        _send(d, "hello")
        _wait(d, lambda d: _idle(d) and _replies(d) and _replies(d)[-1].find_element(By.CSS_SELECTOR, ".content").text)
        assert _status(url, "beta")["value"] == "loaded" and _status(url, "alpha")["value"] == "unloaded"
        # once loaded, the page shows the chosen model's own settings (its /props through the router)
        assert _wait(
            d,
            lambda d: (
                "drafter" in d.find_element(By.ID, "drafter").text or "plain" in d.find_element(By.ID, "drafter").text
            ),
        )
        d.get(url + "/")  # the choice is kept
        assert _wait(d, lambda d: d.find_element(By.ID, "model-pick").get_attribute("value") == "beta")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
