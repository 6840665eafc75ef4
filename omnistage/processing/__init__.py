"""Family-neutral request inputs: the prompt processor interface the front ends are written against
(``prompt.py``) and the media a request carries (``video.py``). Each family implements the interface in its own
package."""
