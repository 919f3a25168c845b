#!/bin/sh
# The client side of the MCP conformance suite: the suite starts a scenario server and runs
# this script with the server's URL as its last argument and the scenario's name in
# MCP_CONFORMANCE_SCENARIO. The script configures the server as the MCP Plugin
# `mcp/conformance` and drives it the way a user would: `promptforge mcp tools` lists its
# tools, and a prompt that binds one calls it. $PROMPTFORGE is the binary under test.
set -eu
for url; do :; done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
case "${MCP_CONFORMANCE_SCENARIO:-}" in
auth/*)
    # Behind OAuth: the tokens in a folder of this run's, and no browser here: curl opens
    # the authorization URL and follows its redirect back to promptforge's loopback port.
    cat > promptforge.toml <<TOML
[mcp.servers.conformance]
url = "$url"
oauth = true
TOML
    # A client registered beforehand (the scenario's context names it): its id in the table,
    # its secret in the environment.
    client_id=$(printf '%s' "${MCP_CONFORMANCE_CONTEXT:-}" | sed -n 's/.*"client_id":"\([^"]*\)".*/\1/p')
    client_secret=$(printf '%s' "${MCP_CONFORMANCE_CONTEXT:-}" | sed -n 's/.*"client_secret":"\([^"]*\)".*/\1/p')
    if [ -n "$client_id" ]; then
        echo "client_id = \"$client_id\"" >> promptforge.toml
        if [ -n "$client_secret" ]; then
            echo 'client_secret_env = "CONFORMANCE_CLIENT_SECRET"' >> promptforge.toml
            export CONFORMANCE_CLIENT_SECRET="$client_secret"
        fi
    fi
    export PROMPTFORGE_OAUTH_DIR="$dir/oauth"
    export BROWSER="curl -fsSL -o /dev/null"
    ;;
*)
    cat > promptforge.toml <<TOML
[mcp.servers.conformance]
url = "$url"
TOML
    ;;
esac
# call TOOL ARGS: run a prompt that binds TOOL of the scenario server and calls it.
call() {
    cat > call.md <<PROMPT
---
name: conformance-call
description: Calls one tool of the conformance server
promptforge: 0
plugins:
  - mcp/conformance
tools:
  it: mcp/conformance/$1
---

# Call

## Call

\`\`\`lua
return tools.call('it', $2)
\`\`\`
PROMPT
    PROMPTFORGE_HISTORY=off "$PROMPTFORGE" run call.md
}
case "${MCP_CONFORMANCE_SCENARIO:-}" in
tools_call) call add_numbers '{ a = 5, b = 3 }' ;;
sse-retry) call test_reconnection '{}' ;;
auth/scope-step-up)
    # A call that needs more scope than listing did: the server answers 403 and promptforge
    # authorizes again with the scope it names (step-up).
    tool=$("$PROMPTFORGE" mcp tools conformance | sed -n 's|^ *mcp/conformance/\([^ ]*\).*|\1|p' | head -n 1)
    call "$tool" '{}' ;;
*) "$PROMPTFORGE" mcp tools conformance ;;
esac
