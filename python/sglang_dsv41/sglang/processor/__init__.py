"""SGLang's multimodal processor package for our model class (`SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE`):
SGLang imports every module here and registers each processor class for the model classes it names."""
