// The console's one script, written here (no library): it connects each element with a
// data-live attribute to its server-sent event stream and puts each fragment the
// server rendered (escaped there, as every page is) where it belongs. A fragment whose
// root has an id replaces the element of that id; else it is appended (data-mode
// "append") or put first ("prepend") in the element. "down" events fill the banner.
"use strict";

function fragment(html) {
  const template = document.createElement("template");
  template.innerHTML = html.trim();
  return template.content.firstElementChild;
}

function place(container, mode, html) {
  const node = fragment(html);
  if (!node) return;
  const same = node.id ? document.getElementById(node.id) : null;
  if (same) {
    same.replaceWith(node);
  } else if (mode === "prepend") {
    container.prepend(node);
  } else if (mode === "route") {
    const events = document.getElementById("events");
    if (events) events.append(node);
  } else {
    container.append(node);
  }
  node.classList.add("fresh");
}

function banner(html) {
  const box = document.getElementById("banner");
  const node = fragment(html);
  const text = node ? node.textContent.trim() : "";
  box.hidden = !text;
  box.textContent = text;
}

function connect(element) {
  const source = new EventSource(element.dataset.live);
  const mode = element.dataset.mode || "append";
  for (const kind of ["event", "row", "record", "status"]) {
    source.addEventListener(kind, (message) => {
      place(element, mode, JSON.parse(message.data).html);
    });
  }
  source.addEventListener("down", (message) => banner(JSON.parse(message.data).html));
  source.onerror = () => banner("<div>The console does not answer; reconnecting…</div>");
  source.onopen = () => banner("<div></div>");
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(connect);
  const retry = document.querySelector("[data-retry]");
  if (retry) {
    setTimeout(() => window.location.reload(), 1000 * Number(retry.dataset.retry));
  }
});
