// The console's one script, written here (no library): it connects each element with a
// data-live attribute to its server-sent event stream and puts each fragment the
// server rendered (escaped there, as every page is) where it belongs:
// - a fragment whose root has an id replaces the element of that id (a row, the
//   session's status line, the whole transcript after a compaction);
// - else an "event" goes at the end of #events, a "message" at the end of #transcript,
//   and a "row" or "record" into the element itself, first (data-mode "prepend") or last.
// A new status shows and hides the forms whose data-when names the statuses they are
// for. "down" events fill the banner.
"use strict";

function fragment(html) {
  const template = document.createElement("template");
  template.innerHTML = html.trim();
  return template.content.firstElementChild;
}

const TARGETS = { event: "events", message: "transcript" };

function place(container, kind, mode, html) {
  const node = fragment(html);
  if (!node) return;
  const same = node.id ? document.getElementById(node.id) : null;
  if (same) {
    const shown = same.cloneNode(true);
    shown.classList.remove("fresh");
    if (shown.isEqualNode(node)) return; // nothing changed: no flash
    same.replaceWith(node);
  } else {
    const target = TARGETS[kind] ? document.getElementById(TARGETS[kind]) : container;
    if (!target) return;
    target.querySelectorAll(":scope > .empty-row").forEach((row) => row.remove());
    if (mode === "prepend") target.prepend(node);
    else target.append(node);
  }
  node.classList.add("fresh");
  if (node.dataset.status) showFor(node.dataset.status);
}

// the forms of the actions a session in this status can take
function showFor(status) {
  document.querySelectorAll("[data-when]").forEach((form) => {
    form.hidden = !form.dataset.when.split(" ").includes(status);
  });
}

function banner(text) {
  const box = document.getElementById("banner");
  box.hidden = !text;
  box.textContent = text;
}

function bannerOf(html) {
  const node = fragment(html);
  banner(node ? node.textContent.trim() : "");
}

// a page being left closes its streams: that is not the console going away
let leaving = false;
window.addEventListener("pagehide", () => {
  leaving = true;
});

function connect(element) {
  const source = new EventSource(element.dataset.live);
  const mode = element.dataset.mode || "append";
  for (const kind of ["event", "message", "transcript", "row", "record", "status"]) {
    source.addEventListener(kind, (message) => {
      place(element, kind, mode, JSON.parse(message.data).html);
    });
  }
  source.addEventListener("down", (message) => bannerOf(JSON.parse(message.data).html));
  source.addEventListener("following", () => {
    element.dataset.following = "";
  });
  source.onerror = () => {
    if (!leaving) banner("The console does not answer; reconnecting…");
  };
  source.onopen = () => banner("");
  window.addEventListener("pagehide", () => source.close());
}

// Before a form is sent, what it would only be refused for is said beside the field,
// and nothing is sent (what was typed stays): a field that takes JSON (data-json names
// it) that is not JSON, or a confirmation (data-confirm) that is not what it asks for.
// The console checks both again.
function wrongIn(field) {
  const text = field.value.trim();
  if (field.dataset.json) {
    if (!text) return `${field.dataset.json} is empty: type null to send none; nothing was sent`;
    try {
      JSON.parse(text);
    } catch (error) {
      return `${field.dataset.json} is not JSON (${error.message}): nothing was sent`;
    }
  }
  if (field.dataset.confirm && text !== field.dataset.confirm) {
    return `type the session's id, ${field.dataset.confirm}, to erase it: nothing was erased`;
  }
  return null;
}

function check(form, event) {
  for (const field of form.querySelectorAll("[data-json], [data-confirm]")) {
    const wrong = wrongIn(field);
    const said = document.getElementById(`${field.id}-error`);
    if (said) {
      said.hidden = !wrong;
      said.textContent = wrong || "";
    }
    if (wrong) {
      event.preventDefault();
      field.focus();
      return;
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(connect);
  document.querySelectorAll("form").forEach((form) => {
    if (form.querySelector("[data-json], [data-confirm]")) {
      form.addEventListener("submit", (event) => check(form, event));
    }
  });
  const retry = document.querySelector("[data-retry]");
  if (retry) {
    setTimeout(() => window.location.reload(), 1000 * Number(retry.dataset.retry));
  }
});
