// Types of `mcp-idempotency` (index.js): SEP-3182 in process for the TypeScript MCP SDK (v1 and v2)
// and punkpeye's fastmcp.

/** Where a claimed call's key reaches the tool: `params._meta['mcp-idem/idempotencyKey']`. */
export declare const META_KEY: 'mcp-idem/idempotencyKey';

/** Every option of `wrap` that `idempotent` takes (kebab-case; camelCase is accepted too). */
export declare const OPTIONS: readonly string[];

/** A gateway that cannot be set up: a bad option, a store URL that does not parse, a store down. */
export declare class IdempotencyError extends Error {
    /** `idempotency_invalid_option`, `idempotency_invalid_store_url` or `idempotency_store_unavailable`. */
    readonly type: string;
    /** The JSON-RPC code of the same failure on the wire (-32602, or -32603 for a store down). */
    readonly code: number;
}

/**
 * One tool's key policy, for its calls that carry no SEP key: the config file's `[tools.NAME]`
 * table (settings in camelCase or kebab-case), as `mcp-idem wrap --tools` takes it.
 */
export interface ToolPolicy {
    /** JSON Pointers into the arguments naming the business identifier: `['/order_id']`. */
    keyFrom?: string | readonly string[];
    'key-from'?: string | readonly string[];
    /** The argument that carries a key (it still reaches the tool). */
    keyArgument?: string;
    'key-argument'?: string;
    /** Identical calls within this long of each other are one call (`'1s'` to `'10m'`). */
    window?: string;
    /** Refuse (-32602, nothing runs) a call without its identifier or key argument. */
    required?: boolean;
    /** What an error outcome leaves: replayed (default) or forgotten, so a retry runs. */
    onError?: 'replay' | 'forget';
    'on-error'?: 'replay' | 'forget';
    /** When the store is down or a quota is full: refuse (default) or run unprotected. */
    storeDown?: 'fail-closed' | 'run-unprotected';
    'store-down'?: 'fail-closed' | 'run-unprotected';
    /** How long a duplicate of a running call waits for its outcome (default `'30s'`). */
    wait?: string;
}

export interface IdempotencyOptions {
    /** A store URL as `mcp-idem wrap --store` takes it; default: SQLite in the user's data directory. */
    store?: string;
    /** Separates this server's records in a shared store (default `mcp-server:NAME`). */
    namespace?: string;
    /** Scopes records to a caller: a string, or a function of the first message's `extra`. */
    principal?: string | ((extra: { authInfo?: { clientId?: string }; [key: string]: unknown } | undefined) => string | undefined);
    /**
     * Key policies by tool name (`'*'`: every tool), for calls that carry no SEP key; or
     * `'suggested'`: what `mcp-idem tools` prints for each tool the server lists (the binding lists
     * them itself before the first call it decides).
     */
    tools?: Record<string, ToolPolicy> | 'suggested';
    /** More `params._meta` members a client's key is read from, beside `idempotencyKey`. */
    metaKey?: string | readonly string[];
    retention?: string;
    lease?: string;
    afterCrash?: 'reject' | 'reexecute';
    forwardKey?: boolean;
    cancel?: 'absorb' | 'forward';
    maxKeyBytes?: number;
    maxArgumentBytes?: number;
    maxOutcomeBytes?: number;
    maxRecordsPerScope?: number;
    maxRecordsTotal?: number;
    /** Where a decision that waits on the store runs: `'runtime'` (default) or `'inline'` (SQLite and memory only). */
    storeIo?: 'runtime' | 'inline';
}

/**
 * Gives `server` SEP-3182 and returns it: an `McpServer` or a low-level `Server` of the TypeScript
 * SDK v1 (`@modelcontextprotocol/sdk`) or v2 (`@modelcontextprotocol/server`), before `connect`;
 * or a `FastMCP` of punkpeye's `fastmcp` 4.x, before `start()` (`stdio` or `httpStream`) or
 * `connect()`. Anything else, a server already connected or already given SEP-3182 throws a
 * `TypeError` at once; a FastMCP started with another transport type rejects its `start()`.
 * Throws an `IdempotencyError` at once when the store, an option or a policy cannot be set up,
 * naming the option or setting as written (`afterCrash: expected reject or reexecute, got "retry"`).
 */
export declare function idempotent<S>(server: S, options?: IdempotencyOptions): S;

/** The idempotency key of the call a tool runs for (`undefined` without one), from its `ctx`. */
export declare function idempotencyKey(ctx: unknown): string | undefined;
