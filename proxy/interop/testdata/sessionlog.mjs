// Preloaded into a server a held-route test must be able to make forget a
// session (node --import ./guard.mjs --import ./sessionlog.mjs SERVER): it
// prints "SESSION <id>" on stdout the first time an HTTP answer carries an
// Mcp-Session-Id header, so the test learns the id of a session mcpheal
// opened (it never reaches the agent) and can end it with a DELETE of its
// own, as a server that expires idle sessions would. The server itself is
// not changed.
import http from "node:http";

const seen = new Set();
function note(id) {
  if (typeof id === "string" && id !== "" && !seen.has(id)) {
    seen.add(id);
    process.stdout.write(`SESSION ${id}\n`);
  }
}
const writeHead = http.ServerResponse.prototype.writeHead;
http.ServerResponse.prototype.writeHead = function (status, ...rest) {
  for (const h of rest) {
    if (h && typeof h === "object" && !Array.isArray(h)) {
      for (const [k, v] of Object.entries(h)) if (k.toLowerCase() === "mcp-session-id") note(v);
    } else if (Array.isArray(h)) {
      for (let i = 0; i + 1 < h.length; i += 2) if (String(h[i]).toLowerCase() === "mcp-session-id") note(String(h[i + 1]));
    }
  }
  note(this.getHeader("mcp-session-id"));
  return writeHead.call(this, status, ...rest);
};
