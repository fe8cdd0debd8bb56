"""`opscope mcp`: a Model Context Protocol server over the public API (opscope.mcp.server). Importing this
package imports nothing of the MCP SDK: only opscope.mcp.server does."""
