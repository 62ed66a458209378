// A real, certified OpenID provider (panva's oidc-provider) on loopback, for edgegw's tests.
//
// Started by tests/e2e/provider.py (`start_provider`); it can also be run by hand:
//
//   node tests/e2e/provider.mjs --port 9000 --redirect-uri http://127.0.0.1:8080/oauth2/callback
//
// Settings (a command-line option wins over its environment variable):
//
//   --port N                          E2E_OIDC_PORT                 0 (any free port)
//   --redirect-uri URI (repeatable)   E2E_OIDC_REDIRECT_URIS        whitespace-separated; required
//   --post-logout-redirect-uri URI    E2E_OIDC_POST_LOGOUT_REDIRECT_URIS   whitespace-separated
//   --backchannel-logout-uri URI      E2E_OIDC_BACKCHANNEL_LOGOUT_URI
//   --client-secret SECRET            E2E_OIDC_CLIENT_SECRET        "edgegw-e2e-secret"
//   E2E_OIDC_EXIT_ON_STDIN_EOF=1: exit when stdin closes (as it does when the parent dies).
//   E2E_OIDC_TTL_<ARTIFACT> seconds, ARTIFACT one of ACCESS_TOKEN (120), AUTHORIZATION_CODE (60),
//   ID_TOKEN (300), REFRESH_TOKEN (3600), INTERACTION (600), SESSION (3600), GRANT (3600).
//
// It listens on 127.0.0.1 (and on ::1 with the same port where it can, as `localhost` may
// resolve to either), its issuer is http://localhost:<port>, and once it listens it prints
// one JSON line on stdout, {"issuer": ..., "port": ...}; everything else goes to stderr.
// Signing keys and cookie keys are generated afresh by each process; state lives in memory.
//
// The client `edgegw` is confidential (client_secret_basic), code flow only, with refresh
// tokens (rotated on every use; replaying a used one revokes the whole grant), PKCE S256
// required. The resource indicator urn:edgegw:api (scope `api`) is the default resource of
// authorization requests; its access tokens are JWTs whose aud is urn:edgegw:api (and whose
// `scope` is "api" when the authorization request asked for it, absent otherwise). At the
// token endpoint oidc-provider issues that JWT only when `resource=urn:edgegw:api` is sent:
// without it (and with `openid` in scope) the access token is an opaque one for userinfo.
//
// The clients edgegw-service and edgegw-service-es256 (same secret) have the client
// credentials grant only; with `resource=urn:edgegw:api` their access tokens are the
// resource's JWTs, signed RS256 and ES256 respectively (both keys are in the JWKS, and
// each process makes new ones: restarting it on the same --port rotates the keys).
//
// Users (devInteractions: the login form takes any password; only these login names are
// accepted, others bring the login form back):
//   alice: groups ["CN=Admins,OU=Groups,DC=Example,DC=Com",
//                  "cn=Smith\, John's Team,ou=groups,dc=example,dc=com"]
//   bob:   groups ["cn=users,ou=groups,dc=example,dc=com"]
//
// Claims (conformIdTokenClaims, the default). The scopes email, profile and groups map to
// email + email_verified, name + given_name + family_name, and groups. When the token
// response's access token is one for userinfo (no `resource` at the token endpoint), the
// id_token holds sub and the protocol claims only (iss, aud, exp, iat, nonce, sid when the
// client has a back-channel logout URI; auth_time/acr/amr when set) and the scopes' claims
// come from userinfo only (the `claims` request parameter is not enabled). When the access token is the resource's JWT (`resource=urn:edgegw:api` at the
// token endpoint), which userinfo refuses, the id_token carries the scopes' claims too.
// Introspection answers for opaque tokens and refresh tokens; it refuses the resource's
// JWTs (unsupported_token_type): those are verified against the JWKS.

import * as crypto from 'node:crypto';
import * as http from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { interactionPolicy } from 'oidc-provider';

// oidc-provider writes its notices with console.info (stdout): stdout is for the ready line.
for (const name of ['log', 'info', 'debug']) {
  console[name] = (...args) => console.error(...args);
}

const RESOURCE = 'urn:edgegw:api';
const CLIENT_ID = 'edgegw';
const SERVICE_CLIENT = 'edgegw-service';
const SERVICE_CLIENT_ES256 = 'edgegw-service-es256';

const USERS = {
  alice: {
    email: 'alice@example.com',
    email_verified: true,
    name: 'Alice Example',
    given_name: 'Alice',
    family_name: 'Example',
    groups: [
      'CN=Admins,OU=Groups,DC=Example,DC=Com',
      "cn=Smith\\, John's Team,ou=groups,dc=example,dc=com",
    ],
  },
  bob: {
    email: 'bob@example.com',
    email_verified: true,
    name: 'Bob Builder',
    given_name: 'Bob',
    family_name: 'Builder',
    groups: ['cn=users,ou=groups,dc=example,dc=com'],
  },
};

function fail(message) {
  console.error(`provider.mjs: ${message}`);
  process.exit(2);
}

function words(value) {
  return (value ?? '').split(/\s+/).filter(Boolean);
}

function settings() {
  const { values } = parseArgs({
    options: {
      port: { type: 'string' },
      'redirect-uri': { type: 'string', multiple: true },
      'post-logout-redirect-uri': { type: 'string', multiple: true },
      'backchannel-logout-uri': { type: 'string' },
      'client-secret': { type: 'string' },
    },
  });
  const env = process.env;
  const port = Number(values.port ?? env.E2E_OIDC_PORT ?? 0);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    fail(`bad port: ${values.port ?? env.E2E_OIDC_PORT}`);
  }
  const redirectUris = values['redirect-uri'] ?? words(env.E2E_OIDC_REDIRECT_URIS);
  if (redirectUris.length === 0) {
    fail('no redirect URI: pass --redirect-uri or set E2E_OIDC_REDIRECT_URIS');
  }
  const ttl = (name, fallback) => {
    const raw = env[`E2E_OIDC_TTL_${name}`];
    if (raw === undefined || raw === '') return fallback;
    const seconds = Number(raw);
    if (!Number.isSafeInteger(seconds) || seconds <= 0) {
      fail(`E2E_OIDC_TTL_${name} must be a positive integer, not ${raw}`);
    }
    return seconds;
  };
  return {
    port,
    redirectUris,
    postLogoutRedirectUris:
      values['post-logout-redirect-uri'] ?? words(env.E2E_OIDC_POST_LOGOUT_REDIRECT_URIS),
    backchannelLogoutUri:
      values['backchannel-logout-uri'] ?? (env.E2E_OIDC_BACKCHANNEL_LOGOUT_URI || undefined),
    clientSecret: values['client-secret'] ?? (env.E2E_OIDC_CLIENT_SECRET || 'edgegw-e2e-secret'),
    ttl: {
      AccessToken: ttl('ACCESS_TOKEN', 120),
      AuthorizationCode: ttl('AUTHORIZATION_CODE', 60),
      IdToken: ttl('ID_TOKEN', 300),
      RefreshToken: ttl('REFRESH_TOKEN', 3600),
      Interaction: ttl('INTERACTION', 600),
      Session: ttl('SESSION', 3600),
      Grant: ttl('GRANT', 3600),
    },
  };
}

// One RS256 and one ES256 key, new kids each process: a restart is a key rotation.
function signingKeys() {
  const rsa = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
  const ec = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
  return {
    keys: [
      { ...rsa.export({ format: 'jwk' }), kid: crypto.randomUUID(), use: 'sig', alg: 'RS256' },
      { ...ec.export({ format: 'jwk' }), kid: crypto.randomUUID(), use: 'sig', alg: 'ES256' },
    ],
  };
}

// devInteractions' login form takes any name: a session whose account findAccount does not
// know (not one of USERS) gets the login form again instead of a server_error later.
function policy() {
  const base = interactionPolicy.base();
  base.get('login').checks.push(new interactionPolicy.Check(
    'unknown_account',
    'the account is not one of the static users',
    'login_required',
    (ctx) => Boolean(ctx.oidc.session.accountId && !ctx.oidc.account),
  ));
  return base;
}

function configuration(config) {
  const client = {
    client_id: CLIENT_ID,
    client_secret: config.clientSecret,
    client_name: 'edgegw',
    token_endpoint_auth_method: 'client_secret_basic',
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    redirect_uris: config.redirectUris,
  };
  if (config.postLogoutRedirectUris.length) {
    client.post_logout_redirect_uris = config.postLogoutRedirectUris;
  }
  if (config.backchannelLogoutUri) {
    client.backchannel_logout_uri = config.backchannelLogoutUri;
    client.backchannel_logout_session_required = true;
  }

  // Service clients (client credentials only) for Bearer tests: their access tokens for
  // the resource are signed RS256, or ES256 for SERVICE_CLIENT_ES256.
  const services = [SERVICE_CLIENT, SERVICE_CLIENT_ES256].map((id) => ({
    client_id: id,
    client_secret: config.clientSecret,
    token_endpoint_auth_method: 'client_secret_basic',
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
  }));

  return {
    clients: [client, ...services],
    jwks: signingKeys(),
    cookies: { keys: [crypto.randomBytes(32).toString('base64url')] },

    async findAccount(_ctx, sub) {
      const user = Object.hasOwn(USERS, sub) ? USERS[sub] : undefined;
      if (user === undefined) return undefined;
      return {
        accountId: sub,
        async claims() {
          return { sub, ...structuredClone(user) };
        },
      };
    },
    // Scope -> claims. The id_token / userinfo split is described at the top of this file.
    claims: {
      acr: null,
      sid: null,
      auth_time: null,
      iss: null,
      openid: ['sub'],
      email: ['email', 'email_verified'],
      profile: ['name', 'given_name', 'family_name'],
      groups: ['groups'],
    },
    conformIdTokenClaims: true,

    // oidc-provider 9 requires PKCE only of public clients by default: require it of all.
    pkce: { required: () => true },
    // A refresh token for every code exchange (not only with offline_access and
    // prompt=consent); a new one at each use. Without offline_access they end with the
    // session (expiresWithSession's default), e.g. at a logout.
    issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
    rotateRefreshToken: true,

    interactions: { policy: policy() },

    features: {
      devInteractions: { enabled: true },
      clientCredentials: { enabled: true },
      backchannelLogout: { enabled: true },
      revocation: { enabled: true },
      introspection: { enabled: true },
      rpInitiatedLogout: { enabled: true },
      resourceIndicators: {
        enabled: true,
        // Authorization requests without `resource` get urn:edgegw:api.
        defaultResource: async (_ctx, _client, oneOf) => oneOf ?? RESOURCE,
        // The token endpoint issues the resource's JWT only when asked (`resource=`);
        // otherwise an opaque access token for userinfo.
        useGrantedResource: async () => false,
        async getResourceServerInfo(_ctx, resourceIndicator, client) {
          if (resourceIndicator !== RESOURCE) {
            throw new Provider.errors.InvalidTarget(`unknown resource ${resourceIndicator}`);
          }
          return {
            scope: 'api',
            audience: RESOURCE,
            accessTokenFormat: 'jwt',
            accessTokenTTL: config.ttl.AccessToken,
            jwt: { sign: { alg: client.clientId === SERVICE_CLIENT_ES256 ? 'ES256' : 'RS256' } },
          };
        },
      },
    },

    ttl: {
      AccessToken: config.ttl.AccessToken,
      AuthorizationCode: config.ttl.AuthorizationCode,
      IdToken: config.ttl.IdToken,
      RefreshToken: config.ttl.RefreshToken,
      Interaction: config.ttl.Interaction,
      Session: config.ttl.Session,
      Grant: config.ttl.Grant,
    },

    // oidc-provider refuses outgoing requests to special-use addresses (SSRF protection):
    // back-channel logout tokens go to the gateway on loopback, so drop that dispatcher.
    fetch: (url, options) => {
      delete options.dispatcher;
      return globalThis.fetch(url, options);
    },

    async renderError(ctx, out, error) {
      console.error('provider.mjs: rendered error:', out, error?.stack ?? error);
      ctx.type = 'json';
      ctx.body = out;
    },
  };
}

function listen(server, options) {
  return new Promise((resolve, reject) => {
    const onError = (err) => reject(err);
    server.once('error', onError);
    server.listen(options, () => {
      server.off('error', onError);
      resolve(server.address().port);
    });
  });
}

async function main() {
  const config = settings();
  let handler = (_req, res) => {
    res.writeHead(503).end();
  };
  const dispatch = (req, res) => handler(req, res);

  const v4 = http.createServer(dispatch);
  const port = await listen(v4, { host: '127.0.0.1', port: config.port });
  const v6 = http.createServer(dispatch);
  try {
    await listen(v6, { host: '::1', port, ipv6Only: true });
  } catch (err) {
    console.error(`provider.mjs: not listening on [::1]:${port} (${err.code ?? err})`);
  }

  const issuer = `http://localhost:${port}`;
  const provider = new Provider(issuer, configuration(config));
  for (const event of [
    'server_error',
    'authorization.error',
    'grant.error',
    'backchannel.error',
    'end_session.error',
    'userinfo.error',
    'introspection.error',
    'revocation.error',
  ]) {
    provider.on(event, (_ctx, err) => {
      console.error(`provider.mjs: ${event}: ${err?.message ?? err}`);
    });
  }
  // One line per token issued at the token endpoint: tests count refreshes from it.
  provider.on('grant.success', (ctx) => {
    console.error(`provider.mjs: grant ${ctx.oidc.params.grant_type} for ${ctx.oidc.client?.clientId}`);
  });
  provider.on('backchannel.success', (_ctx, client, accountId, sid) => {
    console.error(`provider.mjs: back-channel logout of ${accountId} (sid ${sid}) to ${client.clientId}`);
  });
  handler = provider.callback();

  const stop = () => process.exit(0);
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  if (process.env.E2E_OIDC_EXIT_ON_STDIN_EOF === '1') {
    // Started by a test: end with the test process even when it dies without cleaning up.
    process.stdin.on('end', stop).on('close', stop).resume();
  }

  process.stdout.write(`${JSON.stringify({ issuer, port })}\n`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
