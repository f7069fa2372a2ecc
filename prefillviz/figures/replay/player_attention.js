/* The prefill scene's attention map: one head's softmax over the prompt in the one-step prefill.
 *
 * The payload holds a few (layer, head) maps (figures/replay/attention.py), each the lower triangle
 * of the N x N matrix, row-major, one byte a cell: round(255 sqrt(p)). The chosen map is drawn on a
 * canvas as an image, one pixel per (query, key) cell in an off-screen image, scaled up in one
 * drawImage (as the KV grid is). A layer's map appears once the one-step lane's KV-write frame of that
 * layer is shown: its attention ran inside that layer's span.
 *
 *            keys k ->
 *   query    ■ . . .       row q (red): what q's query attended to
 *     q      ■ ■ . .       column k (orange): who attended to k's key
 *     |      ■ ■ ■ .       above the diagonal: masked (causal), grey
 *
 * Pointing at a token lights its row and its column; pointing at a cell (q, k) lights both tokens.
 * What is lit is on the box as data-highlight-row / data-highlight-col (-1: nothing).
 */
(function () {
  "use strict";
  const R = window.Replay;
  const SIZE = 440, PRESENTER_SIZE = 680;
  const MASKED = [225, 229, 234], LOW = [255, 255, 255], HIGH = [8, 48, 107];
  const ROW = "#e45756", COLUMN = "#f58518";

  function decode(cells) { // base64 -> bytes
    const text = atob(cells), bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }

  R.attentionMap = function (attention, lane, parent, onPoint) {
    const N = attention.num_tokens, groups = attention.num_heads / attention.num_kv_heads;
    const prompt = lane.requests[0].prompt;
    const ranAt = new Map(); // layer -> the lane's last KV-write frame of it: the map shows from there on
    lane.frames.kind.forEach((kind, i) => { if (kind === 1) ranAt.set(lane.frames.layer[i], i); });

    const box = R.el("div", { class: "attention", "data-highlight-row": "-1", "data-highlight-col": "-1" });
    const layerSelect = R.el("select", { "aria-label": "attention layer" });
    for (const layer of attention.layers) layerSelect.append(R.el("option", { value: String(layer) }, `layer ${layer}`));
    const headSelect = R.el("select", { "aria-label": "attention head" });
    for (const head of attention.heads) headSelect.append(R.el("option", { value: String(head) }, `head ${head}`));
    const canvas = R.el("canvas", { "aria-label": `attention map: ${N} queries x ${N} keys` });
    const caption = R.el("div", { class: "note" }), info = R.el("div", { class: "info" });
    const shownHeads = attention.heads.length < attention.num_heads
      ? `heads 0–${attention.heads.length - 1} of ${attention.num_heads} (the file keeps a few)` : "every head";
    const side = R.el("div", { class: "attention-text" });
    side.append(R.el("h3", {}, "Attention map of the prefill step"),
      R.el("div", { class: "pickers" }, ""), caption,
      R.el("div", { class: "legend" }, `Layers ${attention.layers.join(", ")}, ${shownHeads}. Colour: √p ` +
        "(sqrt scale, one byte a cell: white p = 0, dark blue p = 1); grey: masked, a query never sees a later " +
        "key. Red outline: the pointed token's row (its query: what it attended to); orange: its column (its " +
        "key: who attended to it). Point at a cell to light its two tokens."), info);
    side.querySelector(".pickers").append(layerSelect, " ", headSelect);
    box.append(canvas, side);
    parent.append(box);

    const off = document.createElement("canvas");
    off.width = N; off.height = N;
    const offCtx = off.getContext("2d");
    let bytes = null, entry = null, count = 0, row = -1, col = -1;
    const p = (q, k) => (bytes[(q * (q + 1)) / 2 + k] / 255) ** 2;
    const ran = () => ranAt.has(entry.layer) && ranAt.get(entry.layer) < count;
    const quote = (pos) => `${pos} “${R.text(prompt[pos])}”`;

    function load() {
      const layer = Number(layerSelect.value), head = Number(headSelect.value);
      entry = attention.maps.find((m) => m.layer === layer && m.head === head);
      bytes = decode(entry.cells);
      const image = offCtx.createImageData(N, N), pixels = image.data;
      for (let q = 0; q < N; q++) {
        const first = (q * (q + 1)) / 2;
        for (let k = 0; k < N; k++) {
          const c = 4 * (q * N + k);
          if (k > q) {
            pixels[c] = MASKED[0]; pixels[c + 1] = MASKED[1]; pixels[c + 2] = MASKED[2];
          } else {
            const t = bytes[first + k] / 255;
            for (let j = 0; j < 3; j++) pixels[c + j] = LOW[j] + (HIGH[j] - LOW[j]) * t;
          }
          pixels[c + 3] = 255;
        }
      }
      offCtx.putImageData(image, 0, 0);
      box.dataset.layer = String(layer);
      box.dataset.head = String(head);
      caption.textContent = `The prefill step's softmax for layer ${layer}, head ${head} (it reads KV head ` +
        `${Math.floor(head / groups)}): row q is query q over keys 0..q. Rebuilt from the queries and keys the ` +
        `inspection pass captured in that step, softmax(q·kᵀ × ${entry.scaling.toPrecision(3)} + causal mask), as ` +
        "the Attention page does.";
    }

    function describe() {
      if (!ran()) return `Layer ${entry.layer} has not run yet at this frame: its map appears when its span ends.`;
      if (row < 0) return "";
      const where = `layer ${entry.layer} head ${entry.head}`;
      if (row !== col) return `Query ${quote(row)} → key ${quote(col)}: p ≈ ${p(row, col).toPrecision(2)} (${where}).`;
      let top = 0, topBy = row;
      for (let k = 0; k <= row; k++) if (p(row, k) > p(row, top)) top = k;
      for (let q = row; q < N; q++) if (p(q, row) > p(topBy, row)) topBy = q;
      return `Position ${quote(row)} (${where}): its row is what it attended to, most of all ${quote(top)} ` +
        `(p ≈ ${p(row, top).toPrecision(2)}); its column is who attended to it, most of all ${quote(topBy)} ` +
        `(p ≈ ${p(topBy, row).toPrecision(2)}).`;
    }

    function render(shown) {
      count = shown;
      const large = !!box.closest(".presenter"), width = box.clientWidth || SIZE;
      const size = Math.max(100, Math.min(large ? PRESENTER_SIZE : SIZE, width));
      const ratio = window.devicePixelRatio || 1;
      canvas.style.width = size + "px"; canvas.style.height = size + "px";
      canvas.width = Math.round(size * ratio); canvas.height = Math.round(size * ratio);
      const ctx = canvas.getContext("2d");
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      box.dataset.shown = String(ran());
      info.textContent = describe();
      if (!ran()) {
        ctx.fillStyle = "#f6f8fa"; ctx.fillRect(0, 0, size, size);
        ctx.fillStyle = "#57606a"; ctx.font = `${large ? 18 : 12}px sans-serif`; ctx.textBaseline = "middle";
        ctx.fillText(`layer ${entry.layer} has not run yet`, 10, size / 2);
        return;
      }
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(off, 0, 0, N, N, 0, 0, size, size);
      const cell = size / N, thick = Math.max(cell, 2);
      ctx.lineWidth = 2;
      if (row >= 0) { ctx.strokeStyle = ROW; ctx.strokeRect(0, row * cell, (row + 1) * cell, thick); }
      if (col >= 0) { ctx.strokeStyle = COLUMN; ctx.strokeRect(col * cell, col * cell, thick, (N - col) * cell); }
    }

    function highlight(query, key) {
      row = query; col = key;
      box.dataset.highlightRow = String(query);
      box.dataset.highlightCol = String(key);
      render(count);
    }

    canvas.addEventListener("pointermove", (event) => {
      if (!ran()) return;
      const rect = canvas.getBoundingClientRect();
      const k = Math.floor(((event.clientX - rect.left) / rect.width) * N);
      const q = Math.floor(((event.clientY - rect.top) / rect.height) * N);
      if (q < 0 || k < 0 || q >= N || k > q || (q === row && k === col)) return; // above the diagonal: masked
      onPoint({ pos: q, key: k });
    });
    for (const select of [layerSelect, headSelect]) select.addEventListener("change", () => { load(); render(count); });
    load();
    return { render, highlight };
  };
})();
