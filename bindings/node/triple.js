// The platform triple of the addon file `mcp-idempotency.TRIPLE.node` (napi-rs's naming), for
// index.js and install.js.
'use strict';

function platformTriple() {
    const { platform, arch } = process;
    if (platform !== 'linux') return `${platform}-${arch}`;
    const glibc = process.report?.getReport?.().header?.glibcVersionRuntime;
    return `linux-${arch}-${glibc ? 'gnu' : 'musl'}`;
}

module.exports = { platformTriple };
