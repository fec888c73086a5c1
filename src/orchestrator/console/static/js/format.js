// Times, durations and small labels, shown the same way on every page.

import { h } from "./dom.js";

// One formatter for every time shown (making one per call, as toLocaleString does, is slow).
const DATE_TIME = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

/** A <time> element: the local date and time, the RFC 3339 value in its datetime attribute. */
export function time(value) {
  if (!value) return "—";
  const moment = new Date(value);
  if (Number.isNaN(moment.getTime())) return String(value);
  return h("time", { datetime: moment.toISOString(), title: moment.toISOString() }, DATE_TIME.format(moment));
}

/** "1 min 5 s", "3.2 s", from two times (the second missing: until now). */
export function duration(from, to) {
  if (!from) return "—";
  const start = new Date(from).getTime();
  const end = to ? new Date(to).getTime() : Date.now();
  const seconds = Math.max(0, (end - start) / 1000);
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 60) return `${Math.round(seconds)} s`;
  const minutes = Math.floor(seconds / 60);
  const rest = Math.round(seconds - minutes * 60);
  if (minutes < 60) return `${minutes} min ${rest} s`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** A status badge: the word itself, styled by its value (never by colour alone). */
export function status(value) {
  const known = ["executing", "succeeded", "failed", "cancelled"];
  return h("span", { class: ["badge", `status-${known.includes(value) ? value : "other"}`] }, value || "—");
}

/** A deployment's mode as octl shows it: deploy, plan only, destroy, rollback. */
export function mode(deployment) {
  if (deployment.plan_only) return "plan only";
  return deployment.mode || "—";
}

export function minutes(value) {
  return `${Number(value || 0).toFixed(2)} min`;
}
