"""LangChain's ``with_structured_output`` for ChatDLM: the runnable, and parsers that report every
miss as ``OutputParserException``, as ChatOpenAI's do."""

from __future__ import annotations

from operator import itemgetter

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableLambda, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel


def structured_output(model, schema: dict | type | None, method: str, include_raw: bool, kwargs: dict) -> Runnable:
    """``model.with_structured_output(schema, method=..., include_raw=...)``: ``function_calling``
    forces a call to the schema as a tool, ``json_schema`` and ``json_mode`` ask for a response_format."""
    is_model = _is_pydantic(schema)
    ls_format = {"kwargs": {"method": method}, "schema": schema}
    if method == "function_calling":
        tool = convert_to_openai_tool(schema)
        name = tool["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, ls_structured_output_format=ls_format, **kwargs)
        parser = (_CallParser(tools=[schema], first_tool_only=True) if is_model
                  else JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
    else:
        if method == "json_schema":
            if schema is None:
                raise ValueError("method='json_schema' needs a schema.")
            json_schema = convert_to_json_schema(schema)
            fmt = {"type": "json_schema", "json_schema": {"name": json_schema.get("title", "output"),
                                                           "schema": json_schema}}
        else:
            fmt = {"type": "json_object"}
        llm = model.bind(response_format=fmt, ls_structured_output_format=ls_format, **kwargs)
        parser = RunnableLambda(_read_parsed(schema if is_model else None))
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser, parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")


def _is_pydantic(schema) -> bool:
    """A pydantic v2 model, or a v1 one (``pydantic.v1``, which LangChain still accepts)."""
    if not isinstance(schema, type):
        return False
    from pydantic.v1 import BaseModel as BaseModelV1

    return issubclass(schema, (BaseModel, BaseModelV1))


def _read_parsed(model: type | None):
    """The structured-output parser: the engine's own parse, already checked against the schema.

    Re-reading the text with LangChain's lenient JSON parser turned a reply that missed the schema
    into ``{}`` or an out-of-bounds object; a miss is an ``OutputParserException`` instead, which
    ``include_raw=True`` reports as ``parsing_error`` with ``parsed=None``, as ChatOpenAI does.
    """
    def read(message: AIMessage):
        parsed = message.additional_kwargs.get("parsed")
        if parsed is None:
            raise OutputParserException(f"The reply does not match the requested JSON schema: {message.content!r}",
                                        llm_output=str(message.content))
        if model is None:
            return parsed
        try:
            return model.model_validate(parsed) if issubclass(model, BaseModel) else model.parse_obj(parsed)
        except ValueError as exc:       # pydantic's ValidationError (v1 and v2): a miss, as ChatOpenAI reports it
            raise OutputParserException(f"The reply does not validate as {model.__name__}: {exc}",
                                        llm_output=str(message.content)) from exc
    return read


class _CallParser(PydanticToolsParser):
    """The forced call's arguments as the schema class. A call that does not validate (a validator
    the JSON schema cannot state), or none at all (the chat layer returns no call that missed the
    tool's parameters), is an ``OutputParserException``, as a miss is on every other method."""

    def parse_result(self, result, *, partial: bool = False):
        try:
            parsed = super().parse_result(result, partial=partial)
        except OutputParserException:
            raise
        except ValueError as exc:
            if partial:
                return None
            raise OutputParserException(f"The forced call's arguments do not validate: {exc}") from exc
        if parsed is None and not partial:
            raise OutputParserException("The reply holds no call that matches the tool's parameters.",
                                        llm_output=str(result[0].text if result else ""))
        return parsed
