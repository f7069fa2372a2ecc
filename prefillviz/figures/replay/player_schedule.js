/* The chunked-prefill scene: each step's token budget filling with decode tokens and prefill chunks.
 *
 *   budget  a canvas column per step, stacked with the chunks the scheduler gave out in batch
 *           order (decodes pale, prefill chunks solid, one colour per request); a step appears
 *           when its scheduling frame is shown
 *   blocks  the cache's blocks, coloured by the request they were allocated to, from that step on
 *   rows    each request's prompt progress and its sampled tokens, as their frames are shown
 *   tokens  the long prompt: pointing at a token lights its chunk and its block
 * A timing pass: the trace has steps and tokens, no per-layer writes and no slot log, so a
 * token's slot is read from the block table (blocks allocated, in order).
 */
(function () {
  "use strict";
  const R = window.Replay;
  const COLORS = ["#4c78a8", "#54a24b", "#b279a2", "#9d755d", "#72b7b2", "#eeca3b", "#ff9da6", "#bab0ac"]; // no red
  const color = (r) => COLORS[r % COLORS.length];
  const AXIS = 40;
  const sum = (chunks) => chunks.reduce((total, c) => total + c[2], 0);

  function drawBudget(canvas, lane, steps, pointed, large) {
    const budget = lane.token_budget, width = canvas.clientWidth || 600, height = large ? 260 : 180;
    const ratio = window.devicePixelRatio || 1, colW = (width - AXIS) / lane.steps.length;
    const scale = (height - 20) / budget;
    canvas.style.height = height + "px";
    canvas.width = width * ratio; canvas.height = height * ratio;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.fillStyle = "#57606a"; ctx.font = "10px sans-serif";
    ctx.fillText(`${budget}`, 2, 12); ctx.fillText("0", 2, height - 10);
    ctx.strokeStyle = "#8c959f"; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(AXIS, 10); ctx.lineTo(width, 10); ctx.stroke(); ctx.setLineDash([]);
    for (let s = 0; s < steps; s++) {
      let y = height - 10;
      for (const [r, , tokens, prefill] of lane.steps[s].chunks) {
        const h = tokens * scale, x = AXIS + s * colW + 1;
        ctx.globalAlpha = prefill ? 1 : 0.45;
        ctx.fillStyle = color(r); ctx.fillRect(x, y - h, colW - 2, h);
        ctx.globalAlpha = 1;
        if (pointed && pointed.step === s && pointed.request === r) {
          ctx.strokeStyle = "#e45756"; ctx.lineWidth = 3; ctx.strokeRect(x, y - h, colW - 2, h);
        }
        y -= h;
      }
    }
    if (steps) {
      ctx.strokeStyle = "#1f2328"; ctx.lineWidth = 1;
      ctx.strokeRect(AXIS + (steps - 1) * colW, 10, colW, height - 20);
    }
  }

  R.kinds.schedule = function (scene, section) {
    const lane = scene.lanes[0], budget = lane.token_budget, bs = lane.block_size, tables = R.blockTables(lane);
    const box = R.laneBox(section, lane, ": step times, no per-layer log");
    const long = lane.requests.reduce((best, q, r) => (q.prompt.length > lane.requests[best].prompt.length ? r : best),
      0); // the long prompt: the one that is chunked
    const longId = lane.requests[long].id;
    const legend = R.el("div", { class: "legend" });
    lane.requests.forEach((q, r) => legend.append(R.el("span", { style: `background:${color(r)}` }, q.id)));
    legend.append("solid: prefill chunk · pale: one decode token");
    const canvas = R.el("canvas", { "aria-label": "token budget of each step" });
    const clock = R.el("div", { class: "clock" }), info = R.el("div", { class: "info" });
    const blocksBox = R.el("div", { class: "blocks", "aria-label": "KV blocks" });
    const cells = [];
    for (let b = 0; b < lane.num_blocks; b++) {
      cells.push(blocksBox.appendChild(R.el("div", { "data-block": `${b}`, title: `block ${b}` }, `${b}`)));
    }
    const owners = new Map(); // block -> [[step, request], ...]: every allocation of it, in step order
    lane.steps.forEach((step, s) => step.alloc.forEach(([r, blocks]) => blocks.forEach((b) => {
      owners.set(b, [...(owners.get(b) || []), [s, r]]);
    })));
    const ownerAt = (b, steps) => { // the request the block was last allocated to before `steps`
      const mine = (owners.get(b) || []).filter(([s]) => s < steps);
      return mine.length ? mine[mine.length - 1][1] : undefined;
    };
    const requestsBox = R.el("div", { class: "requests" });
    const rows = lane.requests.map(() => requestsBox.appendChild(R.el("div")));
    const strip = R.el("div", { class: "tokens", "aria-label": `${longId}'s prompt` });
    const spans = lane.requests[long].prompt.map((token, pos) =>
      strip.appendChild(R.el("span", { "data-pos": `${pos}` }, R.text(token))));
    box.append(legend, canvas, clock, info, R.el("div", {}, `The cache's ${lane.num_blocks} blocks of ${bs} slots:`),
      blocksBox, requestsBox, R.el("div", {}, `${longId}'s prompt (point at a token):`), strip);
    let count = 0, pointed = null;

    function render(shown) {
      count = shown;
      const steps = R.stepsShown(lane, shown), sampled = R.tokensShown(lane, shown);
      drawBudget(canvas, lane, steps, pointed, !!box.closest(".presenter"));
      cells.forEach((cell, b) => {
        const owner = ownerAt(b, steps);
        cell.style.background = owner === undefined ? "" : color(owner);
        cell.classList.toggle("hl", !!pointed && pointed.blocks.includes(b));
      });
      const ran = lane.steps.slice(0, steps);
      lane.requests.forEach((q, r) => {
        const done = sum(ran.flatMap((step) => step.chunks.filter((c) => c[0] === r && c[3])));
        rows[r].replaceChildren(R.el("b", { style: `color:${color(r)}` }, q.id + " "),
          `prompt ${Math.min(done, q.prompt.length)}/${q.prompt.length} computed · `,
          ...sampled[r].map((token) => R.el("span", { class: "out" }, R.text(token))));
      });
      clock.textContent = R.clockText(lane, shown);
      if (steps && !pointed) {
        const step = lane.steps[steps - 1], decode = step.chunks.filter((c) => !c[3]).length;
        const allocated = step.alloc.map(([r, b]) => `${lane.requests[r].id}: [${b.join(", ")}]`).join("; ");
        info.textContent = `Step ${steps}: ${decode} decode token(s) + ${sum(step.chunks.filter((c) => c[3]))} ` +
          `prefill token(s) of the budget ${budget}; allocated ${allocated || "no block"} · ${step.free} blocks ` +
          "free after it.";
      }
    }

    function pointToken(pos) {
      const [step, start, n] = R.chunkOf(lane, long, pos);
      const logical = Math.floor(pos / bs), block = tables[long][logical];
      pointed = { step, request: long, blocks: [block] };
      spans[pos].classList.add("hl");
      for (let p = start; p < start + n; p++) spans[p].classList.add("inchunk");
      box.dataset.highlightChunk = `${step}:${start}:${n}`;
      info.textContent = `Position ${pos} “${R.text(lane.requests[long].prompt[pos])}” ran in step ${step + 1}'s ` +
        `chunk (positions ${start}–${start + n - 1}, green underline); its K/V sit in block ${block} (logical ` +
        `block ${logical}), slot ${block * bs + (pos % bs)} by the block table (a timing pass keeps no slot log).`;
    }
    function pointBlock(block) {
      const r = ownerAt(block, lane.steps.length + 1), logical = r === undefined ? -1 : tables[r].indexOf(block);
      pointed = { step: -1, request: r, blocks: [block] };
      if (r === long) {
        const end = Math.min((logical + 1) * bs, spans.length);
        for (let p = logical * bs; p < end; p++) spans[p].classList.add("inblock");
      }
      info.textContent = r === undefined ? `Block ${block}: never allocated in this run.`
        : `Block ${block}: ${lane.requests[r].id}'s logical block ${logical}, positions ${logical * bs}–` +
          `${(logical + 1) * bs - 1}.`;
    }
    function point(target) {
      spans.forEach((span) => span.classList.remove("hl", "inblock", "inchunk"));
      if (target.pos !== undefined) pointToken(target.pos); else pointBlock(target.block);
      box.dataset.highlightBlock = pointed.blocks.join(",");
      render(count);
    }
    strip.addEventListener("pointerover", (event) => {
      if (event.target.dataset.pos !== undefined) point({ pos: Number(event.target.dataset.pos) });
    });
    blocksBox.addEventListener("pointerover", (event) => {
      if (event.target.dataset.block !== undefined) point({ block: Number(event.target.dataset.block) });
    });
    return { render: (counts) => render(counts[0]) };
  };
})();
