// Building the page: elements are made with createElement and filled with text nodes only. Nothing in
// the console assigns HTML as a string (the Content-Security-Policy enforces Trusted Types with no policy,
// so every HTML sink would throw): what the API answers is always shown as text.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, child);
    else if (child instanceof Node) parent.appendChild(child);
    else parent.appendChild(document.createTextNode(String(child)));
  }
}

function setProps(element, props) {
  for (const [name, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "on") {
      for (const [event, handler] of Object.entries(value)) element.addEventListener(event, handler);
    } else if (name === "class") {
      element.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else if (name === "dataset") {
      for (const [key, data] of Object.entries(value)) element.dataset[key] = String(data);
    } else if (name === "value" || name === "checked" || name === "selected" || name === "disabled") {
      element[name] = value;
    } else if (name.startsWith("on")) {
      throw new Error(`dom: event handlers go in "on", not as attribute ${name}`);
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

/** An HTML element: h("a", {href: "#/runners"}, "Runners"). Children: nodes, strings (as text), arrays. */
export function h(tag, props, ...children) {
  const element = document.createElement(tag);
  setProps(element, props);
  append(element, children);
  return element;
}

/** An SVG element, as h does for HTML. */
export function svg(tag, props, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  setProps(element, props);
  append(element, children);
  return element;
}

/** Replace the children of `parent` with `children`. */
export function fill(parent, ...children) {
  parent.replaceChildren();
  append(parent, children);
  return parent;
}

let idCounter = 0;

/** A fresh id for label/aria-describedby pairs. */
export function uid(prefix) {
  idCounter += 1;
  return `${prefix}-${idCounter}`;
}

/** A definition list from [term, description] pairs (descriptions: nodes or text; empty ones left out). */
export function dl(pairs, props) {
  const list = h("dl", props);
  for (const [term, description] of pairs) {
    if (description === null || description === undefined || description === "") continue;
    list.append(h("dt", null, term), h("dd", null, description));
  }
  return list;
}
