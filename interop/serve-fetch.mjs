// Serves a fetch-style MCP handler (`createMcpHandler(...)` of the TypeScript SDK v2) over
// node:http on 127.0.0.1, a free port; the first stderr line is
// "listening on http://127.0.0.1:PORT/mcp". Shared by interop/ts-server.mjs and the npm
// binding's payments server (bindings/node/test/payments-server.mjs).
import { createServer } from 'node:http';

export function serveFetchHandler(handler) {
    const http = createServer(async (req, res) => {
        try {
            const chunks = [];
            for await (const chunk of req) chunks.push(chunk);
            const headers = new Headers();
            for (const [name, value] of Object.entries(req.headers)) {
                if (value !== undefined) headers.set(name, Array.isArray(value) ? value.join(', ') : value);
            }
            const request = new Request(`http://${req.headers.host ?? '127.0.0.1'}${req.url}`, {
                method: req.method,
                headers,
                body: req.method === 'GET' || req.method === 'HEAD' ? undefined : Buffer.concat(chunks)
            });
            const response = await handler.fetch(request);
            res.writeHead(response.status, Object.fromEntries(response.headers.entries()));
            if (response.body) {
                for await (const chunk of response.body) res.write(chunk);
            }
            res.end();
        } catch (error) {
            process.stderr.write(`request failed: ${error?.stack ?? error}\n`);
            if (!res.headersSent) res.writeHead(500);
            res.end();
        }
    });
    http.listen(0, '127.0.0.1', 511, () => {
        process.stderr.write(`listening on http://127.0.0.1:${http.address().port}/mcp\n`);
    });
    return http;
}
