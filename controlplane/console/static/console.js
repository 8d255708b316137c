// Progressive enhancement only: every page works without this file except the playground's
// live streaming. No inline scripts (the CSP forbids them).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  // Move focus to a freshly shown secret so screen readers announce it.
  const focusMe = document.querySelector("[data-autofocus]");
  if (focusMe) focusMe.focus();

  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.addEventListener("click", async () => {
      const field = document.getElementById(button.dataset.copy);
      field.select();
      try { await navigator.clipboard.writeText(field.value); button.textContent = "Copied"; }
      catch { button.textContent = "Press Ctrl+C"; }
    });
  }

  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }

  const playground = document.getElementById("playground");
  if (playground) setUpPlayground(playground);
});

function setUpPlayground(form) {
  const output = document.getElementById("pg-output");
  const status = document.getElementById("pg-status");
  const send = document.getElementById("pg-send");
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted) {
    const option = [...form.model.options].find((o) => o.value === wanted || o.value.startsWith(wanted + ":"));
    if (option) form.model.value = option.value;
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    output.textContent = "";
    output.setAttribute("aria-busy", "true");
    status.textContent = "Waiting for the first token…";
    send.disabled = true;
    const started = performance.now();
    let firstAt = null;
    try {
      const response = await fetch(form.action, {
        method: "POST",
        headers: { "X-CSRF-Token": form.dataset.csrf },
        body: new URLSearchParams(new FormData(form)),
        credentials: "same-origin",
      });
      if (!response.ok || !response.body) {
        status.textContent = `The console answered ${response.status}.`;
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let usage = null;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          for (const line of event.split("\n")) {
            if (!line.startsWith("data:")) continue;
            const data = line.slice(5).trim();
            if (data === "[DONE]") continue;
            const chunk = JSON.parse(data);
            if (chunk.error) { status.textContent = `Error: ${chunk.error.message}`; continue; }
            if (chunk.usage) usage = chunk.usage;
            const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
            if (delta && delta.content) {
              if (firstAt === null) firstAt = performance.now();
              output.textContent += delta.content;
              status.textContent = "Streaming…";
            }
          }
        }
      }
      if (usage) {
        const ttft = firstAt === null ? "—" : `${Math.round(firstAt - started)} ms`;
        status.textContent = `Done: ${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens; first token after ${ttft}.`;
        output.dataset.completionTokens = usage.completion_tokens;
      } else if (!status.textContent.startsWith("Error")) {
        status.textContent = "Done.";
      }
    } catch (err) {
      status.textContent = `The stream failed: ${err}`;
    } finally {
      output.setAttribute("aria-busy", "false");
      send.disabled = false;
    }
  });
}
