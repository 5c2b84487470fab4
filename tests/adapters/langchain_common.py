"""What the standard unit and integration suites share about ChatDLM."""

from dlm_backend.adapters.langchain import ChatDLM


class ChatDLMSuite:
    @property
    def chat_model_class(self):
        return ChatDLM

    @property
    def has_tool_choice(self):
        return True

    @property
    def supports_json_mode(self):
        return True
