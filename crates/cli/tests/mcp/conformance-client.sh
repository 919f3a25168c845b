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
cat > promptforge.toml <<TOML
[mcp.servers.conformance]
url = "$url"
TOML
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
*) "$PROMPTFORGE" mcp tools conformance ;;
esac
