// The one place a transport's messages pass through the library: every message from the client
// goes to the connection before the server, every message from the server before the client.
'use strict';

const { native } = require('./core.js');

/**
 * `transport`, as the server sees it: every message from the client goes to the connection
 * before the server (in the order it came), every message from the server goes to it before the
 * client. The connection is opened at the first message, whose `extra` names the caller.
 * `listsTools`: the gateway applies the suggested policies (`gateway.listsTools`), so the library
 * may list the server's tools before a `tools/call` (below).
 */
function carry(transport, open, listsTools = false) {
    let connection;
    let serverOnMessage;
    let serverOnClose;
    // Messages whose decision waits on the store, and those after them, are delivered in order
    // (but for a waiting duplicate, below).
    let queue = Promise.resolve();
    let queued = 0;
    const report = (error) => transport.onerror?.(error instanceof Error ? error : new Error(String(error)));

    const deliver = (step, message, extra) => {
        switch (step.action) {
            case 'forward':
                serverOnMessage?.(message, extra);
                break;
            case 'rewritten':
                serverOnMessage?.(JSON.parse(step.message), extra);
                break;
            case 'respond':
                transport.send(JSON.parse(step.message)).catch(report);
                break;
            default: // 'drop'
        }
    };

    // While the server lists its tools for the library (below): the messages after, in order.
    let held = null;
    // The library's own `tools/list` requests still unanswered, by id: what resolves each.
    const listings = new Map();

    // With `tools: 'suggested'`, before a `tools/call` is decided while the server's tools are
    // not known, the library lists them itself, as `wrap` does: its `tools/list` goes to the
    // server, whose answer the library keeps to itself (`send` below). So a key-less retry is
    // decided as the first call was, whether or not a client listed the tools.
    const onmessage = (message, extra) => {
        connection ??= open(extra);
        if (held !== null) {
            held.push([message, extra]);
            return;
        }
        const text = JSON.stringify(message);
        const asked = listsTools && message?.method === 'tools/call' ? connection.toolsRequest(text) : null;
        if (asked !== null) {
            held = [[message, extra]];
            const request = JSON.parse(asked);
            new Promise((resolve) => {
                if (serverOnMessage === undefined) return resolve();
                listings.set(request.id, resolve);
                serverOnMessage(request, extra);
            })
                .catch(report)
                .finally(() => {
                    const backlog = held;
                    held = null;
                    for (const [next, nextExtra] of backlog) onmessage(next, nextExtra);
                });
            return;
        }
        decide(text, message, extra);
    };

    const decide = (text, message, extra) => {
        const step = connection.fromClient(text);
        if (step instanceof native.Waiting) {
            // A duplicate that may wait for a running call's outcome (a key the client did not
            // send): delivered after the messages before it, but the messages after it do not wait
            // for it, since the running call may be waiting for one of them (the client's answer
            // to its elicitation), as `wrap` decides such calls beside its reads.
            Promise.all([step.decided(), queue])
                .then(([settled]) => deliver(settled, message, extra))
                .catch(report);
            return;
        }
        if (queued === 0 && !(step instanceof Promise)) {
            deliver(step, message, extra);
            return;
        }
        queued += 1;
        queue = queue
            .then(() => step)
            .then((settled) => deliver(settled, message, extra))
            .catch(report)
            .finally(() => {
                queued -= 1;
            });
    };

    const send = async (message, options) => {
        if (connection === undefined) return transport.send(message, options);
        let step = connection.fromServer(JSON.stringify(message));
        if (step instanceof Promise) step = await step;
        const listed = message.id === undefined ? undefined : listings.get(message.id);
        if (listed !== undefined) {
            listings.delete(message.id);
            listed();
        }
        if (step.action === 'drop') return;
        return transport.send(step.action === 'rewritten' ? JSON.parse(step.message) : message, options);
    };

    const onclose = () => {
        // Calls still running are recorded outcome-unknown; their answers cannot be sent any more.
        connection?.close().catch(report);
        serverOnClose?.();
    };

    return new Proxy(transport, {
        get(target, property) {
            if (property === 'send') return send;
            // Until the server sets its handlers, those set on the transport before (mcp-proxy's
            // session cleanup, say) are the ones it reads and chains.
            if (property === 'onmessage') return serverOnMessage ?? target.onmessage;
            if (property === 'onclose') return serverOnClose ?? target.onclose;
            const value = Reflect.get(target, property, target);
            return typeof value === 'function' ? value.bind(target) : value;
        },
        set(target, property, value) {
            if (property === 'onmessage') {
                serverOnMessage = value;
                target.onmessage = value === undefined ? undefined : onmessage;
                return true;
            }
            if (property === 'onclose') {
                serverOnClose = value;
                target.onclose = onclose;
                return true;
            }
            return Reflect.set(target, property, value, target);
        }
    });
}

module.exports = { carry };
