"""The chat template shipped with dlm-tiny: Qwen2.5's ChatML with Hermes-style tool calls.

Tools go into the system turn inside <tools></tools>; the assistant calls them with
<tool_call>{"name": ..., "arguments": {...}}</tool_call>; results come back as a user turn wrapped in
<tool_response></tool_response>, the format Qwen-derived diffusion models (Dream) use.
"""

DEFAULT_SYSTEM = "You are dlm-tiny, a helpful assistant."

CHAT_TEMPLATE = (
    "{%- set default_system = '" + DEFAULT_SYSTEM + "' %}"
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{%- set system = messages[0]['content'] %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = default_system %}{%- set rest = messages %}{%- endif %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{{- '\\n\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\nTo call a tool reply with <tool_call>\\n{\"name\": <name>, \"arguments\": <json>}\\n</tool_call>' }}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- for message in rest %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call.get('function') else call %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
# Added but not special: they must survive decode(skip_special_tokens=True) so tool calls can be parsed.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
EOS, MASK = "<|endoftext|>", "<|mask|>"
