/* Stand-in for libnvonnxparser.so.11 (see nvinfer.c): lets the bindings import; never called. */
void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) {
    (void)network; (void)logger; (void)version; return 0;
}
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) {
    (void)refitter; (void)logger; (void)version; return 0;
}
int getNvOnnxParserVersion(void) { return 0; }
