/* The KV grid scene: each lane is the paged KV cache, layers (rows) x cache slots (columns, in blocks).
 *
 * A cell fills when the frame of its layer's KV write is shown; the cells of the latest write are
 * orange. The cells a frame fills are the step's slot mapping from the KV write log, so the grid is
 * the cache as the run wrote it. Drawn on a canvas: one pixel per cell in an off-screen image,
 * scaled up in one drawImage, so 30 layers x 512 slots is one 15k-pixel image per frame, not 15k elements.
 *
 *   band   blocks of the cache (dark: allocated)      pointing at one lights its tokens
 *   grid   L rows x S slots                            pointing at a cell lights its token
 *   band   the chunk (step) that computed the pointed token
 * Under the lanes, the one-step prefill's attention map (player_attention.js): pointing at a token
 * there or here lights its row and column; pointing at a cell (q, k) lights both tokens here.
 */
(function () {
  "use strict";
  const R = window.Replay;
  const EMPTY = [233, 236, 239], FILLED = [76, 120, 168], FRESH = [245, 133, 24];
  const BAND = 16, CHUNK_BAND = 8, GUTTER = 30;

  function laneView(lane, l, section, onPoint) {
    const L = lane.num_layers, bs = lane.block_size, numBlocks = lane.num_blocks, S = numBlocks * bs;
    const cellEvent = new Int32Array(L * S).fill(-1);
    const posSlot = new Map(), posStep = new Map(), slotPos = new Map(), blockStep = new Map();
    lane.steps.forEach((step, s) => {
      for (const [, blocks] of step.alloc) for (const b of blocks) if (!blockStep.has(b)) blockStep.set(b, s);
      for (const [r, positions, slots] of step.kv || []) {
        if (r !== 0) continue;
        positions.forEach((pos, j) => { posSlot.set(pos, slots[j]); posStep.set(pos, s); slotPos.set(slots[j], pos); });
      }
    });
    const f = lane.frames, stepFrame = [];
    f.kind.forEach((kind, i) => {
      if (kind === 0) stepFrame[f.step[i]] = i;
      if (kind !== 1) return;
      for (const [, , slots] of lane.steps[f.step[i]].kv || []) {
        for (const slot of slots) cellEvent[f.layer[i] * S + slot] = i;
      }
    });

    const box = R.el("div", { class: "lane", "data-lane": String(l) });
    const canvas = R.el("canvas", { "aria-label": `${lane.name}: KV cache, ${L} layers x ${S} slots` });
    const clock = R.el("div", { class: "clock" }), info = R.el("div", { class: "info" });
    box.append(R.el("h3", {}, lane.name), R.el("div", { class: "note" }, lane.note),
      R.el("div", { class: "pass" }, `Recorded by the ${lane.pass}.`), canvas, clock, info);
    section.append(box);
    const off = document.createElement("canvas");
    off.width = S; off.height = L;
    const offCtx = off.getContext("2d"), image = offCtx.createImageData(S, L);
    let hl = { slots: [], blocks: [], chunkSlots: [] }, count = 0, geometry = null;

    function render(shown) {
      count = shown;
      const width = canvas.clientWidth || 600, row = box.closest(".presenter") ? 12 : 8;
      const height = BAND + L * row + CHUNK_BAND + 12, ratio = window.devicePixelRatio || 1;
      canvas.style.height = height + "px";
      canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio);
      const ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      const gridW = width - GUTTER, slotW = gridW / S, top = BAND, gridH = L * row;
      geometry = { gridW, slotW, row, top, gridH };
      const last = R.lastFrame(lane, shown), fresh = last && last.kind === "kv_write" ? last.index : -2;
      const pixels = image.data;
      for (let c = 0; c < L * S; c++) {
        const e = cellEvent[c], color = e >= 0 && e < shown ? (e === fresh ? FRESH : FILLED) : EMPTY;
        pixels[4 * c] = color[0]; pixels[4 * c + 1] = color[1]; pixels[4 * c + 2] = color[2]; pixels[4 * c + 3] = 255;
      }
      offCtx.putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, 0, 0, S, L, GUTTER, top, gridW, gridH);
      ctx.fillStyle = "#fff";
      for (let b = 1; b < numBlocks; b++) ctx.fillRect(GUTTER + b * bs * slotW - 0.5, top, 1, gridH);
      for (let b = 0; b < numBlocks; b++) {
        const allocated = blockStep.has(b) && stepFrame[blockStep.get(b)] < shown;
        ctx.fillStyle = hl.blocks.includes(b) ? "#e45756" : allocated ? "#57606a" : "#e9ecef";
        ctx.fillRect(GUTTER + b * bs * slotW + 0.5, 2, bs * slotW - 1, BAND - 5);
      }
      ctx.fillStyle = "#57606a"; ctx.font = "9px sans-serif"; ctx.textBaseline = "middle";
      for (let layer = 0; layer < L; layer += Math.max(1, Math.ceil(L / 6))) {
        ctx.fillText("L" + layer, 2, top + (layer + 0.5) * row);
      }
      ctx.fillText("blocks", 0, BAND / 2);
      ctx.fillStyle = "#2da44e";
      for (const slot of hl.chunkSlots) {
        ctx.fillRect(GUTTER + slot * slotW, top + gridH + 3, Math.max(slotW, 1), CHUNK_BAND);
      }
      ctx.strokeStyle = "#e45756"; ctx.lineWidth = 2;
      for (const slot of hl.slots) ctx.strokeRect(GUTTER + slot * slotW, top, Math.max(slotW, 2), gridH);
      clock.textContent = R.clockText(lane, shown);
    }

    function highlight(positions, pointedBlock, cell) {
      const slots = positions.map((pos) => posSlot.get(pos)).filter((slot) => slot !== undefined);
      const blocks = pointedBlock !== undefined ? [pointedBlock]
        : [...new Set(slots.map((slot) => Math.floor(slot / bs)))];
      hl = { slots, blocks, chunkSlots: [] };
      box.dataset.highlightBlock = blocks.join(",");
      if (cell && slots.length === 2) { // an attention cell: query position, key position
        const [query, key] = positions, where = (slot) => `slot ${slot} (block ${Math.floor(slot / bs)})`;
        box.dataset.highlightSlots = JSON.stringify(slots);
        info.textContent = `Query ${query} “${R.text(lane.requests[0].prompt[query])}” and key ${key} ` +
          `“${R.text(lane.requests[0].prompt[key])}”: their K/V sit in ${where(slots[0])} and ${where(slots[1])} ` +
          "in every layer (red).";
      } else if (positions.length === 1 && slots.length === 1) {
        const pos = positions[0], slot = slots[0], chunk = R.chunkOf(lane, 0, pos);
        const pairs = lane.steps[posStep.get(pos)].layers.map((layer) => [layer, slot]);
        box.dataset.highlightSlots = JSON.stringify(pairs);
        const [step, start, n] = chunk;
        for (let p = start; p < start + n; p++) if (posSlot.has(p)) hl.chunkSlots.push(posSlot.get(p));
        info.textContent = `Position ${pos} “${R.text(lane.requests[0].prompt[pos])}”: cache slot ${slot} = ` +
          `block ${Math.floor(slot / bs)} × ${bs} + ${slot % bs}, written by each of ${pairs.length} layers in step ` +
          `${step + 1}, whose chunk ran positions ${start}–${start + n - 1} (${n} token${n > 1 ? "s" : ""}, green).`;
      } else {
        box.dataset.highlightSlots = JSON.stringify(slots);
        info.textContent = `Block ${blocks.join(", ")}: slots of positions ` +
          (positions.length ? `${Math.min(...positions)}–${Math.max(...positions)}` : "(none written)") + ".";
      }
      render(count);
    }

    canvas.addEventListener("pointermove", (event) => {
      if (!geometry) return;
      const rect = canvas.getBoundingClientRect(), x = event.clientX - rect.left - GUTTER, y = event.clientY - rect.top;
      if (x < 0 || x >= geometry.gridW) return;
      const slot = Math.floor(x / geometry.slotW);
      if (y < BAND) onPoint({ lane: l, block: Math.floor(slot / bs) });
      else if (y < geometry.top + geometry.gridH && slotPos.has(slot)) onPoint({ pos: slotPos.get(slot) });
    });
    const blockTokens = (block) => [...posSlot].filter(([, slot]) => Math.floor(slot / bs) === block)
      .map(([pos]) => pos);
    return { render, highlight, blockTokens };
  }

  R.kinds.kv_grid = function (scene, section) {
    const prompt = scene.lanes[0].requests[0].prompt;
    section.append(R.el("div", { class: "legend" }, "Point at a token, a cell or a block. "),
      R.el("div", { class: "legend" }, "Cells: grey empty · blue written · orange the latest layer's write · " +
        "red outline: the pointed token's slot in every layer · green: its chunk. In the prompt, orange: the key " +
        "of a pointed attention cell."));
    const strip = R.el("div", { class: "tokens", "aria-label": "prompt tokens" });
    const spans = prompt.map((token, pos) => {
      const span = R.el("span", { "data-pos": String(pos), title: `position ${pos}` }, R.text(token));
      strip.append(span);
      return span;
    });
    const lanesBox = R.el("div", { class: "lanes" });
    section.append(strip, lanesBox);
    let views = [], attention = null;
    function point(target) { // {pos}: a token · {pos, key}: an attention cell (query, key) · {lane, block}
      const token = target.pos !== undefined, cell = token && target.key !== undefined && target.key !== target.pos;
      const positions = cell ? [target.pos, target.key] : token ? [target.pos]
        : views[target.lane].blockTokens(target.block);
      spans.forEach((span) => span.classList.remove("hl", "hlkey", "inblock"));
      if (token) spans[target.pos].classList.add("hl");
      else positions.forEach((pos) => spans[pos].classList.add("inblock"));
      if (cell) spans[target.key].classList.add("hlkey");
      section.dataset.pointed = cell ? `cell ${target.pos},${target.key}` : token ? `token ${target.pos}`
        : `block ${target.block}`;
      views.forEach((view, l) => view.highlight(positions, l === target.lane ? target.block : undefined, cell));
      if (attention) attention.highlight(token ? target.pos : -1, cell ? target.key : token ? target.pos : -1);
    }
    views = scene.lanes.map((lane, l) => laneView(lane, l, lanesBox, point));
    if (scene.attention) attention = R.attentionMap(scene.attention, scene.lanes[0], section, point);
    strip.addEventListener("pointerover", (event) => {
      const pos = event.target.dataset && event.target.dataset.pos;
      if (pos !== undefined) point({ pos: Number(pos) });
    });
    return {
      render(counts) {
        views.forEach((view, l) => view.render(counts[l]));
        if (attention) attention.render(counts[0]);
      },
    };
  };
})();
