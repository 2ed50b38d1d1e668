// An MCP client that logs in with OAuth as the TS SDK v1 example client does:
//   node oauthclient.mjs URL [NAME]
// It connects with an OAuthClientProvider (dynamic client registration, PKCE),
// plays the user's part by fetching the authorization URL itself (the SDK's
// demo authorization server approves at once and redirects with the code),
// finishes the login, calls greet({name: NAME}) and prints one line:
//   RESULT {"ok":true,"text":…,"resource":…}    the resource it asked a token for
//   RESULT {"ok":false,"stage":…,"message":…}   where and why it failed
// Without OAuth (a server that needs no login) it simply connects and calls.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { UnauthorizedError } from "@modelcontextprotocol/sdk/client/auth.js";

const [url, name = "mcpheal"] = process.argv.slice(2);
const redirectUrl = "http://127.0.0.1:9/callback"; // never opened: the code is read off the redirect
let code;
let resource;
let stage = "connect";

const provider = {
  _client: undefined, _tokens: undefined, _verifier: undefined,
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return { client_name: "mcpheal-interop", redirect_uris: [redirectUrl], grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"], token_endpoint_auth_method: "none" };
  },
  clientInformation() { return this._client; },
  saveClientInformation(c) { this._client = c; },
  tokens() { return this._tokens; },
  saveTokens(t) { this._tokens = t; },
  saveCodeVerifier(v) { this._verifier = v; },
  codeVerifier() { return this._verifier; },
  async redirectToAuthorization(authUrl) {
    stage = "authorize";
    resource = authUrl.searchParams.get("resource");
    const res = await fetch(authUrl, { redirect: "manual" });
    const location = res.headers.get("location");
    if (!location) throw new Error(`authorization answered ${res.status} without a redirect`);
    code = new URL(location).searchParams.get("code");
  },
};

function print(obj) { process.stdout.write(`RESULT ${JSON.stringify(obj)}\n`); }

async function connect() {
  const client = new Client({ name: "mcpheal-interop-oauth", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
  await client.connect(transport);
  return client;
}

try {
  let client;
  try {
    client = await connect();
  } catch (e) {
    if (!(e instanceof UnauthorizedError) || !code) throw e;
    stage = "token";
    const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider });
    await transport.finishAuth(code);
    stage = "reconnect";
    client = await connect();
  }
  stage = "call";
  const res = await client.callTool({ name: "greet", arguments: { name } });
  print({ ok: !res.isError, text: res.content?.[0]?.text ?? "", resource });
  await client.close();
  process.exit(0);
} catch (e) {
  print({ ok: false, stage, message: String(e?.message ?? e), resource });
  process.exit(1);
}
