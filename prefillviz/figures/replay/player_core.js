/* The replay player's core: the recorded frames in order, the controls, pointing.
 *
 * A scene's frames are its lanes' recorded events (figures/replay/frames.py). The cursor is a count
 * `shown`: the first `shown` frames of the current order are drawn, nothing else. Two orders:
 *   time   by measured time (each lane's clock from its own first step); playing moves a clock and
 *          shows every frame whose time has come (speed: clock seconds per real second)
 *   step   one frame per tick, lanes side by side (their i-th frames together)
 * Scene views (player_kv.js, player_schedule.js, player_prefix.js) register in Replay.kinds and draw a lane from
 * `counts[lane]`: how many of its frames are shown.
 */
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("replay-data").textContent);
  const root = document.getElementById("replay");
  const KINDS = ["step", "kv_write", "token"];
  const STEP_RATE = 30; // frames per second at speed 1 in step order
  const R = (window.Replay = { data, root, KINDS, kinds: {}, views: [], state: null });

  R.el = function (tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  };
  R.text = function (token) {
    const text = data.token_text[String(token)];
    return text === undefined ? "#" + token : text.replace(/\n/g, "⏎").replace(/\t/g, "⇥");
  };
  R.ms = (seconds) => (seconds * 1000).toLocaleString("en", { maximumFractionDigits: 2 }) + " ms";
  R.blockTables = function (lane) { // per request: its physical blocks in logical order (hits, then allocations)
    const tables = lane.requests.map(() => []);
    lane.steps.forEach((step) => {
      for (const [r, blocks] of step.hit) tables[r].push(...blocks);
      for (const [r, blocks] of step.alloc) tables[r].push(...blocks);
    });
    return tables;
  };
  R.chunkOf = function (lane, request, position) { // [step index, first position, tokens] of the chunk that ran it
    for (let s = 0; s < lane.steps.length; s++) {
      for (const [r, start, n] of lane.steps[s].chunks) {
        if (r === request && position >= start && position < start + n) return [s, start, n];
      }
    }
    return null;
  };
  R.lastFrame = function (lane, count) { // the lane's latest shown frame, as an object (null before the first)
    if (count === 0) return null;
    const f = lane.frames, i = count - 1;
    return { index: i, kind: KINDS[f.kind[i]], step: f.step[i], layer: f.layer[i], request: f.request[i],
      token: f.token[i], time_s: f.time_s[i] };
  };
  R.stepsShown = function (lane, count) { // how many steps have their scheduling frame shown
    let steps = 0;
    for (let i = 0; i < count; i++) if (lane.frames.kind[i] === 0) steps = lane.frames.step[i] + 1;
    return steps;
  };
  R.tokensShown = function (lane, count) { // per request, its sampled tokens shown so far
    const out = lane.requests.map(() => []);
    for (let i = 0; i < count; i++) {
      if (lane.frames.kind[i] === 2) out[lane.frames.request[i]].push(lane.frames.token[i]);
    }
    return out;
  };
  R.laneBox = function (section, lane, what) { // a lane's title, note and the pass that recorded it
    const box = R.el("div", { class: "lane", "data-lane": "0" });
    box.append(R.el("h3", {}, lane.name), R.el("div", { class: "note" }, lane.note),
      R.el("div", { class: "pass" }, `Recorded by the ${lane.pass}${what}.`));
    section.append(box);
    return box;
  };
  R.clockText = function (lane, count) {
    const frame = R.lastFrame(lane, count);
    if (!frame) return "t = 0 ms · no event yet";
    const steps = lane.steps.length;
    let what = "";
    if (frame.kind === "step") {
      const tokens = lane.steps[frame.step].chunks.reduce((sum, c) => sum + c[2], 0);
      what = `scheduled ${tokens.toLocaleString("en")} token(s)`;
    } else if (frame.kind === "kv_write") {
      const written = (lane.steps[frame.step].kv || []).reduce((sum, entry) => sum + entry[2].length, 0);
      what = `layer ${frame.layer} wrote K/V of ${written.toLocaleString("en")} position(s)`;
    } else {
      what = `${lane.requests[frame.request].id} sampled “${R.text(frame.token)}”`;
    }
    return `t = ${R.ms(frame.time_s)} · step ${frame.step + 1} of ${steps.toLocaleString("en")} · ${what}`;
  };

  function orders(scene) {
    const entries = [];
    scene.lanes.forEach((lane, l) => lane.frames.time_s.forEach((t, i) => entries.push([l, i, t])));
    return {
      time: entries.slice().sort((a, b) => a[2] - b[2] || a[0] - b[0] || a[1] - b[1]),
      step: entries.slice().sort((a, b) => a[1] - b[1] || a[0] - b[0]),
    };
  }

  // ------------------------------------------------------------------ the page (after the views registered)
  R.start = function () {
    root.dataset.frames = String(data.num_frames);
    const header = R.el("header");
    header.append(R.el("h1", {}, "Watch it happen: prefill, replayed from a real run"));
    header.append(R.el("div", { class: "meta" }, `${data.model_id} · ${data.device} · ${data.dtype} · ` +
      `${data.num_frames.toLocaleString("en")} recorded events. Every frame is one event the run recorded, at ` +
      "its measured time; nothing between events is drawn."));
    const nav = R.el("nav");
    const controls = R.el("div", { class: "controls" });
    const buttons = {};
    for (const [name, label, title] of [["back", "◀ step", "One frame back"], ["play", "▶ play", "Play / pause"],
      ["forward", "step ▶", "One frame forward"], ["start", "start", "Back to the first frame"]]) {
      buttons[name] = R.el("button", { type: "button", "data-action": name, title }, label);
      controls.append(buttons[name]);
    }
    const scrubber = R.el("input", { type: "range", min: "0", max: "0", value: "0", "aria-label": "frame" });
    const counter = R.el("span", { class: "counter" });
    const speed = R.el("select", { "aria-label": "speed" });
    for (const value of [0.001, 0.01, 0.1, 0.25, 0.5, 1, 2, 5, 10, 100]) {
      speed.append(R.el("option", { value: String(value) }, value + "×"));
    }
    speed.value = "1";
    const axis = R.el("select", { "aria-label": "time axis" });
    axis.append(R.el("option", { value: "time" }, "measured time"), R.el("option", { value: "step" }, "step order"));
    const presenter = R.el("button", { type: "button", "data-action": "presenter" }, "presenter");
    controls.append(scrubber, counter, R.el("span", {}, "speed"), speed, axis, presenter);
    const axisNote = R.el("div", { class: "axis-note" });
    const stage = R.el("main");
    root.append(header, nav, controls, axisNote, stage);

    const scenes = data.scenes.map((scene, index) => {
      const section = R.el("section", { class: "scene", "data-scene": scene.id, "data-frames": String(scene.num_frames),
        hidden: "" });
      section.append(R.el("h2", {}, scene.title), R.el("p", { class: "caption" }, scene.caption));
      stage.append(section);
      const button = R.el("button", { type: "button", "data-scene": scene.id, "aria-pressed": "false" }, scene.title);
      button.addEventListener("click", () => choose(index));
      nav.append(button);
      const view = R.kinds[scene.kind](scene, section);
      return { scene, section, button, view, orders: orders(scene) };
    });

    const state = (R.state = { scene: 0, shown: 0, clock: 0, playing: false, last: 0, ticks: 0 });
    const current = () => scenes[state.scene];
    const order = () => current().orders[axis.value];
    const total = () => current().scene.num_frames;

    function counts() {
      const result = current().scene.lanes.map(() => 0);
      const list = order();
      for (let k = 0; k < state.shown; k++) result[list[k][0]] = Math.max(result[list[k][0]], list[k][1] + 1);
      return result;
    }
    function draw() {
      const c = counts();
      current().view.render(c);
      scrubber.value = String(state.shown);
      counter.textContent = `frame ${state.shown.toLocaleString("en")} of ${total().toLocaleString("en")}`;
      current().section.dataset.shown = String(state.shown);
      root.dataset.shown = String(state.shown);
    }
    function seek(shown) {
      state.shown = Math.max(0, Math.min(total(), shown));
      state.clock = state.shown ? order()[state.shown - 1][2] : 0;
      state.ticks = state.shown;
      draw();
    }
    function choose(index) {
      pause();
      scenes.forEach((s, i) => {
        s.section.hidden = i !== index;
        s.button.setAttribute("aria-pressed", String(i === index));
      });
      state.scene = index;
      root.dataset.scene = current().scene.id;
      scrubber.max = String(total());
      seek(0);
    }
    function timeShown(clock) { // frames whose measured time has come: a binary search over the time order
      const list = current().orders.time;
      let lo = 0, hi = list.length;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (list[mid][2] <= clock) lo = mid + 1; else hi = mid; }
      return lo;
    }
    function tick(now) {
      if (!state.playing) return;
      const elapsed = Math.min((now - state.last) / 1000, 0.25) * Number(speed.value);
      state.last = now;
      if (axis.value === "time") { state.clock += elapsed; state.shown = timeShown(state.clock); }
      else { state.ticks += elapsed * STEP_RATE; state.shown = Math.min(total(), Math.floor(state.ticks)); }
      draw();
      if (state.shown >= total()) pause(); else requestAnimationFrame(tick);
    }
    function play() {
      if (state.shown >= total()) seek(0);
      state.playing = true;
      state.last = performance.now();
      buttons.play.textContent = "|| pause";
      root.dataset.playing = "true";
      requestAnimationFrame(tick);
    }
    function pause() {
      state.playing = false;
      buttons.play.textContent = "▶ play";
      root.dataset.playing = "false";
    }
    function noteAxis() {
      axisNote.textContent = axis.value === "time"
        ? "Time axis: measured. Each frame appears when its recorded time comes on its run's clock " +
          "(per-layer clock for KV writes); speed 1× is real time."
        : "Time axis: step order. One recorded event per tick, lanes side by side; times are not to scale.";
    }
    buttons.play.addEventListener("click", () => (state.playing ? pause() : play()));
    buttons.back.addEventListener("click", () => { pause(); seek(state.shown - 1); });
    buttons.forward.addEventListener("click", () => { pause(); seek(state.shown + 1); });
    buttons.start.addEventListener("click", () => { pause(); seek(0); });
    scrubber.addEventListener("input", () => { pause(); seek(Number(scrubber.value)); });
    axis.addEventListener("change", () => { const keep = state.shown; noteAxis(); seek(keep); });
    presenter.addEventListener("click", () => { root.classList.toggle("presenter"); draw(); });
    window.addEventListener("resize", () => draw());
    document.addEventListener("keydown", (event) => { // a presenter's clicker sends these keys
      if (["INPUT", "SELECT"].includes(event.target.tagName)) return;
      if (event.target.tagName === "BUTTON" && event.key === " ") return; // the button's own click
      const action = { " ": "play", ArrowRight: "forward", PageDown: "forward", ArrowLeft: "back", PageUp: "back" };
      if (action[event.key]) { event.preventDefault(); buttons[action[event.key]].click(); }
    });
    R.redraw = draw;
    R.seek = seek;
    R.choose = (id) => choose(scenes.findIndex((s) => s.scene.id === id));
    noteAxis();
    choose(0);
    root.dataset.ready = "true";
  };
})();
