/* Stand-in for libnvinfer_plugin.so.11 (see nvinfer.c): lets the bindings import; never called. */
int initLibNvInferPlugins(void *logger, const char *lib_namespace) { (void)logger; (void)lib_namespace; return 0; }
