// What every part of the page shares: its state, the server's API, and small DOM helpers.

// The page's state. `streaming` is the id of the thread whose run this page streams now (null when none); `waiting`
// is true while the open thread waits on a human; `listed` is the thread list as last loaded.
export const state = {
  assistants: [], assistant: null, threadId: null, thread: null, stopped: null, waiting: false, streaming: null,
  listed: [], listings: 0, titles: new Map(), openKeys: new Set(), history: [], view: "conversation", pollTimer: null,
};

export const $ = (selector) => document.querySelector(selector);

export function headers() {
  const key = $("#api-key").value.trim();
  return { "Content-Type": "application/json", ...(key ? { "x-api-key": key } : {}) };
}

export async function api(method, path, body) {
  const response = await fetch(path, { method, headers: headers(), body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new Error((data && data.detail) || `${response.status} ${response.statusText}`);
  return data;
}

export function showError(error) {
  const box = $("#error");
  box.textContent = String(error.message || error);
  box.hidden = false;
  clearTimeout(showError.timer);
  showError.timer = setTimeout(() => { box.hidden = true; }, 6000);
}

// An event handler that shows its errors. It calls `fn` at once, so that `fn` may still call preventDefault().
export const guarded = (fn) => (...args) => {
  try {
    return Promise.resolve(fn(...args)).catch(showError);
  } catch (error) {
    showError(error);
    return Promise.resolve();
  }
};

export const quote = (value) => encodeURIComponent(value);

export const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child);
  return node;
};

export const pretty = (value) => JSON.stringify(value, null, 2);
export const short = (id) => (id ? id.slice(0, 8) + "…" + id.slice(-4) : "");
export const when = (text) => (text ? new Date(text).toLocaleString() : "");

// A thread's status as the page names it: a busy thread is "running".
export const statusLabel = (status) => (status === "busy" ? "running" : status);

export function contentText(content) {
  if (typeof content === "string") return content;
  return (content || []).map((block) => (block.type === "text" ? block.text : `[${block.type}]`)).join("\n");
}
