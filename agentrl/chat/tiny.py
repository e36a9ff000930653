"""The tiny policy's chat template, which agentrl gives every tiny policy it builds: kept apart from
`agentrl.policy` (which loads torch) so that a command can tell the tiny policy's folder from a pretrained
model's by reading its template (`agentrl.models.is_tiny_policy`) before anything heavy is imported."""

# ChatML with tools, laid out as Qwen2.5's template lays them out (tool results come back as a
# user turn wrapped in <tool_response>), but listing each tool in one compact line
# (`name(arg: type, ...): description`) so that a small model's context is not spent on JSON schema.
TINY_CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' -%}{%- set sys = messages[0].content -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- if sys or tools -%}{{ '<|im_start|>system\\n' + sys }}"
    "{%- if tools -%}{{ '\\nTools:' }}{%- for t in tools -%}{{ '\\n' + t.function.name + '(' }}"
    "{%- for name, p in t.function.parameters.properties.items() -%}{{ name + ': ' + (p.type or 'any') }}"
    "{%- if not loop.last -%}{{ ', ' }}{%- endif -%}{%- endfor -%}{{ '): ' + t.function.description }}"
    "{%- endfor -%}{%- endif -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- if m.role == 'tool' -%}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + "
    "'\\n</tool_response><|im_end|>\\n' }}{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' "
    "}}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
