// Preloaded into every server the interop tests start (node --import ./guard.mjs).
// It keeps third-party servers on the test's terms without patching them:
//   - a listen on a bare port (server-everything's app.listen(PORT)) binds
//     127.0.0.1 instead of every interface;
//   - once listening, it prints "LISTENING <port>" on stdout, so a server
//     started on port 0 tells the test where it is;
//   - the process exits when stdin closes (the test, or the go test binary,
//     went away) or after INTEROP_LIFETIME_MS (default 180000; the tests
//     set it from go test's deadline), so no server outlives the test run,
//     and says so on stderr.
import net from "node:net";

const loopback = "127.0.0.1";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const a0 = args[0];
  if (typeof a0 === "number" || (typeof a0 === "string" && /^\d+$/.test(a0))) {
    if (typeof args[1] === "string") args[1] = loopback;
    else args.splice(1, 0, loopback);
  } else if (a0 === undefined || typeof a0 === "function") {
    args.unshift(0, loopback);
  } else if (a0 && typeof a0 === "object" && a0.path === undefined) {
    args[0] = { ...a0, host: loopback };
  }
  this.once("listening", () => {
    const addr = this.address();
    if (addr && typeof addr === "object") process.stdout.write(`LISTENING ${addr.port}\n`);
  });
  return listen.apply(this, args);
};

process.stdin.on("end", () => process.exit(0));
process.stdin.on("error", () => process.exit(0));
process.stdin.resume();
const lifetime = Number(process.env.INTEROP_LIFETIME_MS || 180000);
setTimeout(() => {
  process.stderr.write(`guard: lifetime of ${lifetime} ms over, exiting\n`);
  process.exit(3);
}, lifetime).unref();
