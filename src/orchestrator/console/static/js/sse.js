// Server-sent events over fetch(): EventSource cannot send an Authorization header, so the console reads
// the text/event-stream body itself and parses it as the HTML standard says (fields event, data, id;
// comment lines; a blank line dispatches).

/** Read the events of `response` (a fetch Response), calling onEvent({event, data, id}) for each. Ends
 * when the stream ends or `signal` aborts. */
export async function readEvents(response, onEvent, signal) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const abort = () => reader.cancel().catch(() => {});
  if (signal) signal.addEventListener("abort", abort, { once: true });
  let buffer = "";
  let event = { event: "message", data: [], id: null };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let newline;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        // A CR at the end may be the first half of a CRLF: wait for the next read.
        if (buffer[newline] === "\r" && newline === buffer.length - 1) break;
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
        if (line === "") {
          if (event.data.length) onEvent({ event: event.event, data: event.data.join("\n"), id: event.id });
          event = { event: "message", data: [], id: event.id };
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let fieldValue = colon < 0 ? "" : line.slice(colon + 1);
        if (fieldValue.startsWith(" ")) fieldValue = fieldValue.slice(1);
        if (field === "event") event.event = fieldValue;
        else if (field === "data") event.data.push(fieldValue);
        else if (field === "id") event.id = fieldValue;
      }
    }
  } finally {
    if (signal) signal.removeEventListener("abort", abort);
  }
}
