/* The prefix-cache scene: requests that share a prefix, one after another on one engine.
 *
 * Each request's prompt is drawn in its blocks (the block table: hits, then allocations). A hit
 * block turns green when the step that found it is shown; a token turns blue when the step whose
 * chunk computed it is shown; sampled tokens follow in orange. Pointing at a block lights the
 * same physical block wherever a later request hit it: the same K/V, computed once.
 *
 *   q1  [C][C][C][C][C][C][p]      C computed, p partial (no hash: the prompt ends inside it)
 *   q2  [H][H][H][H][C][C][p]      H hit
 */
(function () {
  "use strict";
  const R = window.Replay;

  function howText(block) {
    if (block.hit) return "a hit: its K/V were computed by an earlier request and reused";
    if (block.full) return "computed by this request, then hashed for the ones after it";
    return "partial: the prompt ends inside it, so it has no hash";
  }

  R.kinds.prefix = function (scene, section) {
    const lane = scene.lanes[0], bs = lane.block_size, tables = R.blockTables(lane);
    const box = R.laneBox(section, lane, ": step times, no per-layer log");
    box.append(R.el("div", { class: "legend" }, "Boxes are blocks (physical id on hover). Green: a hit, its K/V " +
      "reused. Blue tokens: computed in a shown step. Orange: sampled. Point at a token or a block."));
    const firstStep = lane.requests.map(() => -1), tokenStep = lane.requests.map((q) => q.prompt.map(() => -1));
    lane.steps.forEach((step, s) => {
      for (const [r] of step.hit) if (firstStep[r] < 0) firstStep[r] = s;
      for (const [r, start, n, prefill] of step.chunks) {
        if (firstStep[r] < 0) firstStep[r] = s;
        if (prefill) for (let p = start; p < start + n; p++) tokenStep[r][p] = s;
      }
    });
    const clock = R.el("div", { class: "clock" }), info = R.el("div", { class: "info" });
    const blocks = [], outs = [];
    lane.requests.forEach((q, r) => {
      const row = box.appendChild(R.el("div", { class: "prow", "data-request": q.id }));
      row.append(R.el("b", {}, q.id));
      for (let logical = 0; logical * bs < q.prompt.length; logical++) {
        const physical = tables[r][logical], end = Math.min((logical + 1) * bs, q.prompt.length);
        const cell = row.appendChild(R.el("div", { class: "pblock", "data-block": `${physical}`,
          title: `block ${physical} (logical ${logical})` }));
        const spans = [];
        for (let p = logical * bs; p < end; p++) spans.push(cell.appendChild(R.el("span", { "data-pos": `${p}` },
          R.text(q.prompt[p]))));
        blocks.push({ cell, spans, r, logical, physical, hit: logical * bs < q.num_cached_tokens,
          full: (logical + 1) * bs <= q.prompt.length });
      }
      outs.push(row.appendChild(R.el("span")));
    });
    box.append(clock, info);

    function render(shown) {
      const steps = R.stepsShown(lane, shown), sampled = R.tokensShown(lane, shown);
      for (const block of blocks) {
        block.cell.classList.toggle("hit", block.hit && firstStep[block.r] >= 0 && firstStep[block.r] < steps);
        block.spans.forEach((span, k) => {
          const s = tokenStep[block.r][block.logical * bs + k];
          span.classList.toggle("done", s >= 0 && s < steps);
        });
      }
      outs.forEach((out, r) => out.replaceChildren(
        ...sampled[r].map((token) => R.el("span", { class: "out" }, R.text(token)))));
      clock.textContent = R.clockText(lane, shown);
    }

    box.addEventListener("pointerover", (event) => {
      const cell = event.target.closest && event.target.closest(".pblock");
      if (!cell) return;
      const block = blocks.find((b) => b.cell === cell), q = lane.requests[block.r];
      const pos = event.target.dataset.pos !== undefined ? Number(event.target.dataset.pos) : undefined;
      const same = blocks.filter((b) => b.physical === block.physical && b.full);
      const sharing = same.some((b) => b.hit) ? same : [block]; // one K/V: a full block a later request hit
      blocks.forEach((b) => {
        b.cell.classList.toggle("hl", sharing.includes(b));
        b.spans.forEach((span) => span.classList.remove("hl"));
      });
      if (pos !== undefined) event.target.classList.add("hl");
      box.dataset.highlightBlock = `${block.physical}`;
      const shared = sharing.length > 1 ? ` · shared by ${sharing.map((b) => lane.requests[b.r].id).join(", ")}` : "";
      const what = pos !== undefined ? `${q.id} position ${pos} “${R.text(q.prompt[pos])}”: ` : `${q.id}: `;
      info.textContent = what +
        `block ${block.physical} (logical ${block.logical}), ${howText(block)}${shared}.`;
    });
    return { render: (counts) => render(counts[0]) };
  };
})();
