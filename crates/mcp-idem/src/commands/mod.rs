pub(crate) mod demo;
