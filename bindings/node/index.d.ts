// Types of `mcp-idempotency` (index.js): SEP-3182 in process for the TypeScript MCP SDK v2.

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

export interface IdempotencyOptions {
    /** A store URL as `mcp-idem wrap --store` takes it; default: SQLite in the user's data directory. */
    store?: string;
    /** Separates this server's records in a shared store (default `mcp-server:NAME`). */
    namespace?: string;
    /** Scopes records to a caller: a string, or a function of the first message's `extra`. */
    principal?: string | ((extra: { authInfo?: { clientId?: string }; [key: string]: unknown } | undefined) => string | undefined);
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
}

/**
 * Gives `server` (an `McpServer` or a low-level `Server`) SEP-3182 and returns it; call it before
 * `connect`. Throws an `IdempotencyError` at once when the store cannot be set up.
 */
export declare function idempotent<S>(server: S, options?: IdempotencyOptions): S;

/** The idempotency key of the call a tool runs for (`undefined` without one), from its `ctx`. */
export declare function idempotencyKey(ctx: unknown): string | undefined;
