// Small DOM helpers: find and build elements (text only, never HTML), announce to screen readers.

export const $ = (id) => document.getElementById(id);
let idCounter = 0;
export const uid = (prefix) => `${prefix}-${++idCounter}`;

/** Build an element. Children and the "text" prop become text nodes, never HTML. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name === "on") for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export function pretty(value) {
  try {
    const text = JSON.stringify(value, null, 2);
    return text === undefined ? String(value) : text;
  } catch {
    return String(value);
  }
}

export function announce(text) {
  const region = $("announcer");
  region.textContent = "";
  // A fresh text node after clearing makes screen readers speak repeated messages too.
  setTimeout(() => { region.textContent = text; }, 50);
}
