/* Stand-in for libnvinfer.so.11 so that TensorRT's Python bindings IMPORT on a machine without a GPU.
 * The bindings only need these symbols to load; nothing in the contract suite calls them (a call would
 * dereference the null objects returned here). Introspection only: classes, enums, docstring signatures. */
void *createInferBuilder_INTERNAL(void *logger, int version) { (void)logger; (void)version; return 0; }
void *createInferRuntime_INTERNAL(void *logger, int version) { (void)logger; (void)version; return 0; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) {
    (void)engine; (void)logger; (void)version; return 0;
}
void *getPluginRegistry(void) { return 0; }
void *getBuilderPluginRegistry(int kind) { (void)kind; return 0; }
